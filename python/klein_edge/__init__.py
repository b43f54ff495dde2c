"""Klein Edge from Python: FLUX.2-klein and Z-Image image generation on the CPU.

    import klein_edge
    model = klein_edge.Model("klein-4b-q4.klein")
    model.generate("a red fox in fresh snow", width=512, height=512, seed=42).save("fox.png")

`Model` opens a container or a diffusers directory once; `generate` returns a PIL image whose
pixels are those `klein generate` writes for the same arguments, with the parameters text
and the JSON metadata the CLI stores in `image.info` ("parameters", "klein"); `save` writes
the file as the CLI does, with them and the XMP provenance record). Errors are `KleinError` (`Cancelled` when a generation was stopped) with
the engine's message. The package is a thin layer over the C library (include/klein/klein.h,
loaded with ctypes): it converts arguments and results and adds nothing to the engine.
"""
import ctypes
import math
import os
import signal
import tempfile
import threading

from . import _capi

__version__ = "0.1.0"

__all__ = ["Model", "KleinError", "Cancelled", "Flagged", "library_version", "save",
           "__version__"]


class KleinError(RuntimeError):
    """A failure the engine reported; the message is the engine's."""


class Cancelled(KleinError):
    """The generation was stopped: by `Model.cancel`, or by a progress or preview callback."""


class Flagged(KleinError):
    """The safety check flagged an input image or the generated one (safety_model=...; the
    message names the nsfw probability and the threshold), or the prompt check the prompt
    (check_prompt=True): no image is given."""


def library_version():
    """The C library's version string, e.g. "0.1.0 (commit abc1234)"."""
    return _capi.library().klein_version().decode()


def _path_bytes(value, what):
    try:
        return os.fsencode(os.fspath(value))
    except TypeError:
        raise TypeError(f"{what}: expected a path (str or os.PathLike), got "
                        f"{type(value).__name__}") from None


def _optional_path(value, what):
    return None if value is None else _path_bytes(value, what)


def _text(value, what):
    if not isinstance(value, str):
        raise TypeError(f"{what}: expected str, got {type(value).__name__}")
    return value.encode("utf-8")


class _ImageFiles:
    """Hands image arguments to the engine as files: paths as they are, PIL images written
    losslessly (PNG, in their own mode) to a temporary folder, so the engine reads them exactly
    as it reads the same image saved by the caller and given to `klein generate`."""

    def __init__(self):
        self._dir = None
        self._count = 0

    def path(self, value, what):
        if value is None:
            return None
        if hasattr(value, "save") and hasattr(value, "mode") and hasattr(value, "size"):
            if self._dir is None:
                self._dir = tempfile.TemporaryDirectory(prefix="klein-edge-")
            self._count += 1
            file = os.path.join(self._dir.name, f"{self._count}.png")
            value.save(file, format="PNG")
            return os.fsencode(file)
        return _path_bytes(value, what + " (a path or a PIL image)")

    def close(self):
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None


def _c_array(ctype, values):
    return (ctype * len(values))(*values) if values else None


class Model:
    """An opened model and a compute session over it.

    path: a klein container or a diffusers directory (None when single files are given).
    diffusion_model, text_encoder, vae, tokenizer: single files, as `klein generate`'s options.
    threads: worker threads (0: the usable CPUs). max_memory: the budget in bytes (0: the
    available memory less a margin). residency: "auto", "paged" or "resident". precision:
    "auto", "exact" or "fast". prompt_cache_dir: where contexts are cached per prompt.

    One generation runs at a time on a Model (calls from several threads wait their turn);
    `cancel` may be called from any thread. Close it with `close()` or a `with` block.
    """

    def __init__(self, path=None, *, diffusion_model=None, text_encoder=None, vae=None,
                 tokenizer=None, threads=0, max_memory=0, residency="auto", precision="auto",
                 prompt_cache_dir=None):
        lib = _capi.library()
        self._lib = lib
        self._model = None
        self._session = None
        self._lock = threading.Lock()
        if residency not in _capi.RESIDENCIES:
            raise ValueError(f"residency: expected one of {', '.join(_capi.RESIDENCIES)}, got "
                             f"{residency!r}")
        if precision not in _capi.PRECISIONS:
            raise ValueError(f"precision: expected one of {', '.join(_capi.PRECISIONS)}, got "
                             f"{precision!r}")
        if not isinstance(threads, int) or threads < 0:
            raise ValueError(f"threads: expected 0 (all usable CPUs) or more, got {threads!r}")
        if not isinstance(max_memory, int) or max_memory < 0:
            raise ValueError(f"max_memory: expected bytes, 0 or more, got {max_memory!r}")

        options = _capi.ModelOptions()
        lib.klein_model_options_init(ctypes.byref(options))
        options.diffusion_model = _optional_path(diffusion_model, "diffusion_model")
        options.text_encoder = _optional_path(text_encoder, "text_encoder")
        options.vae = _optional_path(vae, "vae")
        options.tokenizer = _optional_path(tokenizer, "tokenizer")
        model = ctypes.c_void_p()
        error = ctypes.c_void_p()
        status = lib.klein_model_open(_optional_path(path, "path"), ctypes.byref(options),
                                      ctypes.byref(model), ctypes.byref(error))
        if status != _capi.KLEIN_OK:
            raise KleinError(_capi.take_string(lib, error) or "cannot open the model")
        self._model = model

        session_options = _capi.SessionOptions()
        lib.klein_session_options_init(ctypes.byref(session_options))
        session_options.threads = threads
        session_options.max_memory = max_memory
        session_options.residency = _capi.RESIDENCIES[residency]
        session_options.precision = _capi.PRECISIONS[precision]
        session_options.prompt_cache_dir = _optional_path(prompt_cache_dir, "prompt_cache_dir")
        session = ctypes.c_void_p()
        status = lib.klein_session_new(model, ctypes.byref(session_options),
                                       ctypes.byref(session), ctypes.byref(error))
        if status != _capi.KLEIN_OK:
            message = _capi.take_string(lib, error)
            self.close()
            raise KleinError(message or "cannot start a session")
        self._session = session

    @property
    def name(self):
        """The configuration's name, e.g. "klein-4b"."""
        self._check_open()
        return self._lib.klein_model_name(self._model).decode()

    def cancel(self):
        """Stops the running generation (from any thread); it raises `Cancelled`. A call when
        nothing runs has no effect on the next generation."""
        session = self._session
        if session is not None:
            self._lib.klein_session_cancel(session)

    def close(self):
        """Frees the session and unmaps the model. Waits for a running generation."""
        with self._lock:
            if self._session is not None:
                self._lib.klein_session_free(self._session)
                self._session = None
            if self._model is not None:
                self._lib.klein_model_free(self._model)
                self._model = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if getattr(self, "_lock", None) is not None:
            try:
                self.close()
            except Exception:  # interpreter shutdown: the library may already be gone
                pass

    def _check_open(self):
        if self._model is None:
            raise KleinError("the model is closed")

    def generate(self, prompt, *, negative_prompt=None, width=None, height=None, steps=None,
                 guidance=None, seed=None, references=(), init_image=None, mask=None,
                 strength=None, loras=(), cfg_normalization=None, cfg_truncation=None,
                 watermark=True, progress=None, preview=None, count=None, safety_model=None,
                 safety_threshold=None, safety_action="refuse", controlnet=None,
                 control_image=None, control_scale=None, tiny_vae=None, decoder="full",
                 preview_size=None, check_prompt=False, cache=None):
        """Generates one image and returns it as a PIL image (RGB); with count=N, a list of N
        images with seeds seed, seed+1, ... denoised together (each transformer block read
        once per step for all of them), image i the one generate makes with seed + i.

        prompt: a str; "" is the empty prompt (an unconditional image, as the official
        pipelines make it).
        width, height: pixels, multiples of 16 (None: the first reference's size, else 1024).
        steps, guidance: None for the model's defaults. seed: an integer for a reproducible
        image (None: drawn at random; the one used is image.info["seed"]).
        references: images to edit from (PIL images or paths), in order.
        init_image, mask, strength: image-to-image and inpainting (mask: white repaints).
        loras: LoRA files of the transformer, as paths or (path, scale) pairs.
        cfg_normalization, cfg_truncation: Z-Image's guidance options.
        controlnet, control_image, control_scale: Z-Image's ControlNet (the control model's
        directory or single file, the image to follow as a PIL image or a path, and
        controlnet_conditioning_scale, None: 0.75); with init_image and mask, inpainting.
        watermark: False leaves the pixels without the invisible dwtDct mark (FLUX's message)
        that images of at least 256x256 pixels carry by default.
        safety_model: the safety classifier's Hugging Face directory
        (Falconsai/nsfw_image_detection), as `klein generate --safety-model`: the input images
        are classified before any work and the generated one after decoding; an image whose
        nsfw probability is above safety_threshold (None: 0.85) raises Flagged, unless
        safety_action is "blur" (the generated image is returned strongly blurred). The
        verdicts are in image.info["klein"]'s "safety".
        tiny_vae: a tiny autoencoder's decoder file (taef2_decoder.pth for FLUX.2,
        taef1_decoder.pth for Z-Image): previews are its pictures, at most preview_size
        (None: 256) pixels on the long side; decoder="tiny" decodes the image with it instead
        of the model's VAE (a draft at a fraction of the cost). Without tiny_vae, a container
        that holds a tiny decoder (klein convert --tiny-vae) gives its own.
        check_prompt: True asks the text encoder first, as BFL's reference does, whether the
        prompt names copyrighted characters, brands or living public figures (`klein
        generate --check-prompt`; the model must keep its language-model head: a container
        made with --keep-llm, or the diffusers directory); a flagged prompt raises Flagged
        before any work.
        cache: step caching as `klein generate --cache`, "first-block:T" (diffusers'
        FirstBlockCache with threshold T; Z-Image); None: off.
        progress(phase, done, total, seconds): called as phases begin, step and end.
        preview(step, steps, image): a PIL image of the step's estimate after each step (with
        count, of the first image): the tiny decoder's picture with tiny_vae, else a colour fit
        of the latents, one pixel per 8x8.
        A callback that returns True stops the generation (Cancelled); one that raises stops
        it and its exception is raised from generate.
        """
        from PIL import Image as PILImage

        lib = self._lib
        params = _capi.GenerateParams()
        lib.klein_generate_params_init(ctypes.byref(params))
        params.prompt = _text(prompt, "prompt")
        if negative_prompt is not None:
            params.negative_prompt = _text(negative_prompt, "negative_prompt")
        params.width = _int_or(width, 0, "width")
        params.height = _int_or(height, 0, "height")
        params.steps = _int_or(steps, 0, "steps")
        if guidance is not None:
            params.guidance = float(guidance)
        if seed is not None:
            if not isinstance(seed, int) or not 0 <= seed < 2**64:
                raise ValueError(f"seed: expected an integer from 0 to 2^64 - 1, got {seed!r}")
            params.seed = seed
            params.has_seed = 1
        if strength is not None:
            params.strength = float(strength)
        if cfg_normalization is not None:
            params.cfg_normalization = float(cfg_normalization)
        if cfg_truncation is not None:
            params.cfg_truncation = float(cfg_truncation)
        params.controlnet = _optional_path(controlnet, "controlnet")
        if decoder not in ("full", "tiny"):
            raise ValueError(f"decoder: expected 'full' or 'tiny', got {decoder!r}")
        params.tiny_vae = _optional_path(tiny_vae, "tiny_vae")
        params.tiny_decode = 1 if decoder == "tiny" else 0
        if preview_size is not None:
            if (isinstance(preview_size, bool) or not isinstance(preview_size, int)
                    or not 8 <= preview_size <= 8192):
                raise ValueError(f"preview_size: expected an integer from 8 to 8192, got "
                                 f"{preview_size!r}")
            params.preview_size = preview_size
        if control_scale is not None:
            params.control_scale = float(control_scale)
        if not isinstance(watermark, bool):
            raise TypeError(f"watermark: expected True or False, got {watermark!r}")
        params.no_watermark = 0 if watermark else 1
        if not isinstance(check_prompt, bool):
            raise TypeError(f"check_prompt: expected True or False, got {check_prompt!r}")
        params.check_prompt = 1 if check_prompt else 0
        if cache is not None:
            if not isinstance(cache, str):
                raise TypeError(f"cache: expected a str such as \"first-block:0.1\", got {cache!r}")
            params.cache = cache.encode()
        if safety_action not in _capi.SAFETY_ACTIONS:
            raise ValueError(f"safety_action: expected one of "
                             f"{', '.join(_capi.SAFETY_ACTIONS)}, got {safety_action!r}")
        if safety_model is None and (safety_threshold is not None or safety_action != "refuse"):
            raise ValueError("safety_threshold and safety_action need safety_model (the "
                             "classifier's directory)")
        params.safety_model = _optional_path(safety_model, "safety_model")
        if safety_threshold is not None:
            if (isinstance(safety_threshold, bool)
                    or not isinstance(safety_threshold, (int, float))
                    or not 0 <= safety_threshold <= 1):
                raise ValueError(f"safety_threshold: expected a number in [0, 1], got "
                                 f"{safety_threshold!r}")
            params.safety_threshold = float(safety_threshold)
        params.safety_action = _capi.SAFETY_ACTIONS[safety_action]
        if count is not None and (isinstance(count, bool) or not isinstance(count, int)
                                  or not 1 <= count <= 1000):
            raise ValueError(f"count: expected an integer from 1 to 1000, got {count!r}")

        lora_files, lora_scales = [], []
        for i, item in enumerate(loras):
            path, scale = (item if isinstance(item, (tuple, list)) else (item, 1.0))
            lora_files.append(_path_bytes(path, f"loras[{i}]"))
            scale = float(scale)
            if not math.isfinite(scale):
                raise ValueError(f"loras[{i}]: the scale must be a finite number, got {scale}")
            lora_scales.append(scale)

        # The callbacks run on this thread, inside klein_generate; what they raise is kept and
        # raised after the engine has unwound.
        raised = []

        def guard(fn):
            try:
                return 1 if fn() else 0
            except BaseException as e:  # KeyboardInterrupt included: Ctrl-C stops the engine
                raised.append(e)
                return 1

        def on_progress(info, _user):
            p = info.contents
            return guard(lambda: progress and progress(p.phase.decode(), p.done, p.total,
                                                       p.seconds))

        def on_preview(info, _user):
            p = info.contents
            def call():
                size = p.width * p.height * 3
                small = PILImage.frombytes("RGB", (p.width, p.height),
                                           ctypes.string_at(p.pixels, size))
                return preview(p.step, p.steps, small)
            return guard(call)

        # A progress callback is always installed: Python runs its signal handlers only
        # between its own instructions, and the callbacks are where it gets to run them.
        progress_fn = _capi.PROGRESS_FN(on_progress)
        params.progress = progress_fn
        preview_fn = _capi.PREVIEW_FN(on_preview) if preview else _capi.PREVIEW_FN()
        params.preview = preview_fn

        files = _ImageFiles()
        try:
            ref_paths = [files.path(r, f"references[{i}]") for i, r in enumerate(references)]
            ref_array = _c_array(ctypes.c_char_p, ref_paths)
            params.references = ref_array
            params.reference_count = len(ref_paths)
            params.init_image = files.path(init_image, "init_image")
            params.mask = files.path(mask, "mask")
            params.control_image = files.path(control_image, "control_image")
            lora_array = _c_array(ctypes.c_char_p, lora_files)
            scale_array = _c_array(ctypes.c_float, lora_scales)
            params.loras = lora_array
            params.lora_scales = scale_array
            params.lora_count = len(lora_files)

            results = (ctypes.POINTER(_capi.Image) * (count or 1))()
            with self._lock, _CtrlC(self) as ctrl_c:
                self._check_open()
                if count is None:
                    status = lib.klein_generate(self._session, ctypes.byref(params), results)
                else:
                    status = lib.klein_generate_batch(self._session, ctypes.byref(params),
                                                      count, results)
                message = lib.klein_session_error(self._session).decode("utf-8", "replace")
        finally:
            files.close()

        made = [r for r in results if r]
        if ctrl_c.pressed and not raised:
            raised.append(KeyboardInterrupt())
        if raised:
            for r in made:
                lib.klein_image_free(r)
            raise raised[0]
        if status == _capi.KLEIN_ERROR_CANCELLED:
            raise Cancelled(message or "cancelled")
        if status == _capi.KLEIN_ERROR_FLAGGED:
            raise Flagged(message or "the safety check flagged an image")
        if status != _capi.KLEIN_OK:
            raise KleinError(message or f"generation failed (status {status})")
        images = []
        try:
            for result in made:
                r = result.contents
                pixels = ctypes.string_at(r.pixels, r.width * r.height * r.channels)
                image = PILImage.frombytes("RGB", (r.width, r.height), pixels)
                image.info["parameters"] = r.parameters.decode("utf-8")
                image.info["klein"] = r.metadata.decode("utf-8")
                image.info["seed"] = r.seed
                image.info["steps"] = r.steps
                image.info["guidance"] = r.guidance
                images.append(image)
        finally:
            for r in made:
                lib.klein_image_free(r)
        return images[0] if count is None else images


class _CtrlC:
    """While a generation runs on the main thread with Python's default SIGINT handler, Ctrl-C
    cancels it (the engine stops at its next check) and generate raises KeyboardInterrupt.
    Without this the KeyboardInterrupt would surface inside a ctypes callback, where ctypes
    prints and drops it, and the generation would run on."""

    def __init__(self, model):
        self._model = model
        self._previous = None
        self.pressed = False

    def __enter__(self):
        if (threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGINT) is signal.default_int_handler):
            self._previous = signal.signal(signal.SIGINT, self._on_sigint)
        return self

    def _on_sigint(self, signum, frame):
        self.pressed = True
        self._model.cancel()

    def __exit__(self, *exc):
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


def _int_or(value, default, what):
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{what}: expected an integer, got {type(value).__name__}")
    if not 0 < value < 2**31:
        raise ValueError(f"{what}: expected a positive integer, got {value}")
    return value


def save(image, path):
    """Writes a generated image as `klein generate` does, through the engine's own writer:
    PNG or JPEG (quality 95) by the extension, with the parameters text, the JSON metadata and
    the XMP provenance record (IPTC digital source type) the CLI stores; atomically."""
    lib = _capi.library()
    rgb = image.convert("RGB") if image.mode != "RGB" else image
    pixels = rgb.tobytes()
    buffer = (ctypes.c_uint8 * len(pixels)).from_buffer_copy(pixels)
    c_image = _capi.Image()
    c_image.width, c_image.height = rgb.size
    c_image.channels = 3
    c_image.pixels = ctypes.cast(buffer, ctypes.POINTER(ctypes.c_uint8))
    for key, field in (("parameters", "parameters"), ("klein", "metadata")):
        if key in image.info:
            setattr(c_image, field, image.info[key].encode("utf-8"))
    error = ctypes.c_void_p()
    status = lib.klein_image_save(ctypes.byref(c_image), _path_bytes(path, "path"),
                                  ctypes.byref(error))
    if status != _capi.KLEIN_OK:
        raise KleinError(_capi.take_string(lib, error) or f"cannot write {path}")
