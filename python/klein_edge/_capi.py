"""The C library (include/klein/klein.h) seen through ctypes: its structs, its functions, and
where the shared library is found. Nothing here knows about PIL or Python conveniences; the
package's __init__ builds the Python API on top.

The structs below mirror the header field by field; tests/test_layout.py compiles a C program
that prints the header's sizes and offsets and compares them with these.
"""
import ctypes
import ctypes.util
import os
import pathlib

KLEIN_OK = 0
KLEIN_ERROR = 1
KLEIN_ERROR_CANCELLED = 2
KLEIN_ERROR_ARGUMENT = 3
KLEIN_ERROR_FLAGGED = 4

PRECISIONS = {"auto": 0, "exact": 1, "fast": 2}
RESIDENCIES = {"auto": 0, "paged": 1, "resident": 2}
SAFETY_ACTIONS = {"refuse": 0, "blur": 1}


class ModelOptions(ctypes.Structure):
    _fields_ = [
        ("diffusion_model", ctypes.c_char_p),
        ("text_encoder", ctypes.c_char_p),
        ("vae", ctypes.c_char_p),
        ("tokenizer", ctypes.c_char_p),
    ]


class SessionOptions(ctypes.Structure):
    _fields_ = [
        ("threads", ctypes.c_int),
        ("max_memory", ctypes.c_uint64),
        ("residency", ctypes.c_int),
        ("precision", ctypes.c_int),
        ("prompt_cache_dir", ctypes.c_char_p),
    ]


class Progress(ctypes.Structure):
    _fields_ = [
        ("phase", ctypes.c_char_p),
        ("done", ctypes.c_int),
        ("total", ctypes.c_int),
        ("seconds", ctypes.c_double),
    ]


class Preview(ctypes.Structure):
    _fields_ = [
        ("step", ctypes.c_int),
        ("steps", ctypes.c_int),
        ("width", ctypes.c_int),
        ("height", ctypes.c_int),
        ("pixels", ctypes.POINTER(ctypes.c_uint8)),
    ]


PROGRESS_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(Progress), ctypes.c_void_p)
PREVIEW_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(Preview), ctypes.c_void_p)


class GenerateParams(ctypes.Structure):
    _fields_ = [
        ("prompt", ctypes.c_char_p),
        ("negative_prompt", ctypes.c_char_p),
        ("width", ctypes.c_int),
        ("height", ctypes.c_int),
        ("steps", ctypes.c_int),
        ("guidance", ctypes.c_float),
        ("seed", ctypes.c_uint64),
        ("has_seed", ctypes.c_int),
        ("references", ctypes.POINTER(ctypes.c_char_p)),
        ("reference_count", ctypes.c_int),
        ("progress", PROGRESS_FN),
        ("user_data", ctypes.c_void_p),
        ("init_image", ctypes.c_char_p),
        ("mask", ctypes.c_char_p),
        ("strength", ctypes.c_float),
        ("preview", PREVIEW_FN),
        ("loras", ctypes.POINTER(ctypes.c_char_p)),
        ("lora_scales", ctypes.POINTER(ctypes.c_float)),
        ("lora_count", ctypes.c_int),
        ("cfg_normalization", ctypes.c_float),
        ("cfg_truncation", ctypes.c_float),
        ("no_watermark", ctypes.c_int),
        ("safety_model", ctypes.c_char_p),
        ("safety_threshold", ctypes.c_float),
        ("safety_action", ctypes.c_int),
        ("controlnet", ctypes.c_char_p),
        ("control_image", ctypes.c_char_p),
        ("control_scale", ctypes.c_float),
        ("tiny_vae", ctypes.c_char_p),
        ("tiny_decode", ctypes.c_int),
        ("preview_size", ctypes.c_int),
        ("check_prompt", ctypes.c_int),
        ("cache", ctypes.c_char_p),
    ]


class Image(ctypes.Structure):
    _fields_ = [
        ("width", ctypes.c_int),
        ("height", ctypes.c_int),
        ("channels", ctypes.c_int),
        ("pixels", ctypes.POINTER(ctypes.c_uint8)),
        ("seed", ctypes.c_uint64),
        ("steps", ctypes.c_int),
        ("guidance", ctypes.c_float),
        ("parameters", ctypes.c_char_p),
        ("metadata", ctypes.c_char_p),
    ]


# (name, return type, argument types) of every function the package calls.
_FUNCTIONS = [
    ("klein_version", ctypes.c_char_p, []),
    ("klein_string_free", None, [ctypes.c_void_p]),
    ("klein_model_options_init", None, [ctypes.POINTER(ModelOptions)]),
    ("klein_model_open", ctypes.c_int,
     [ctypes.c_char_p, ctypes.POINTER(ModelOptions), ctypes.POINTER(ctypes.c_void_p),
      ctypes.POINTER(ctypes.c_void_p)]),
    ("klein_model_free", None, [ctypes.c_void_p]),
    ("klein_model_name", ctypes.c_char_p, [ctypes.c_void_p]),
    ("klein_session_options_init", None, [ctypes.POINTER(SessionOptions)]),
    ("klein_session_new", ctypes.c_int,
     [ctypes.c_void_p, ctypes.POINTER(SessionOptions), ctypes.POINTER(ctypes.c_void_p),
      ctypes.POINTER(ctypes.c_void_p)]),
    ("klein_session_free", None, [ctypes.c_void_p]),
    ("klein_session_error", ctypes.c_char_p, [ctypes.c_void_p]),
    ("klein_session_cancel", None, [ctypes.c_void_p]),
    ("klein_generate_params_init", None, [ctypes.POINTER(GenerateParams)]),
    ("klein_generate", ctypes.c_int,
     [ctypes.c_void_p, ctypes.POINTER(GenerateParams), ctypes.POINTER(ctypes.POINTER(Image))]),
    ("klein_generate_batch", ctypes.c_int,
     [ctypes.c_void_p, ctypes.POINTER(GenerateParams), ctypes.c_int,
      ctypes.POINTER(ctypes.POINTER(Image))]),
    ("klein_image_free", None, [ctypes.POINTER(Image)]),
    ("klein_image_save", ctypes.c_int,
     [ctypes.POINTER(Image), ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]),
]

_library = None


def _candidates():
    """Where the shared library may be, in the order tried."""
    given = os.environ.get("KLEIN_LIBRARY")
    if given:
        # Given explicitly: that file or nothing, so a wrong path is an error, not a fallback.
        return [given]
    here = pathlib.Path(__file__).resolve().parent
    found = [str(here / "libklein.so.0")]  # copied in by `pip install ./python`
    # Used from a source tree: python/klein_edge/ next to build/.
    found.append(str(here.parent.parent / "build" / "libklein.so.0"))
    system = ctypes.util.find_library("klein")  # installed: /usr/lib/<triplet>/libklein.so.0
    if system:
        found.append(system)
    return found


def library():
    """The loaded C library, loaded on first use. Raises OSError naming what was tried."""
    global _library
    if _library is not None:
        return _library
    tried = []
    for path in _candidates():
        if os.sep in path and not os.path.exists(path):
            tried.append(f"{path} (no such file)")
            continue
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            tried.append(f"{path} ({e})")
            continue
        for name, restype, argtypes in _FUNCTIONS:
            fn = getattr(lib, name)
            fn.restype = restype
            fn.argtypes = argtypes
        _library = lib
        return lib
    raise OSError(
        "klein_edge: cannot load the Klein Edge library (libklein.so.0); tried: "
        + "; ".join(tried or ["no location"])
        + ". Build it (scripts/setup.sh) and set KLEIN_LIBRARY=/path/to/build/libklein.so.0, "
        "or install the klein-edge package.")


def take_string(lib, pointer):
    """A library-allocated C string as str, freed."""
    if not pointer:
        return ""
    try:
        return ctypes.string_at(pointer).decode("utf-8", "replace")
    finally:
        lib.klein_string_free(pointer)
