/* Klein Edge: FLUX.2-klein image generation on the CPU, as a C library.
 *
 *   klein_model    an opened model (a klein container, or a diffusers directory of
 *                  FLUX.2-klein), mapped read-only; open once, use for many images
 *   klein_session  a compute context over a model: worker threads, precision, memory budget,
 *                  prompt cache; generates one image at a time
 *   klein_image    an 8-bit RGB image with its metadata, freed with klein_image_free
 *
 * A minimal program:
 *
 *   klein_model* model;
 *   char* error = NULL;
 *   if (klein_model_open("klein-4b-q4.klein", NULL, &model, &error) != KLEIN_OK) {
 *     fprintf(stderr, "%s\n", error);
 *     klein_string_free(error);
 *     return 1;
 *   }
 *   klein_session* session;
 *   klein_session_new(model, NULL, &session, &error);
 *   klein_generate_params p;
 *   klein_generate_params_init(&p);
 *   p.prompt = "a red fox in fresh snow";
 *   p.width = p.height = 512;
 *   p.seed = 42;
 *   p.has_seed = 1;
 *   klein_image* image;
 *   if (klein_generate(session, &p, &image) == KLEIN_OK) {
 *     klein_image_save(image, "fox.png", NULL);
 *     klein_image_free(image);
 *   } else {
 *     fprintf(stderr, "%s\n", klein_session_error(session));
 *   }
 *   klein_session_free(session);
 *   klein_model_free(model);
 *
 * Thread safety: every function may be called from any thread. A session is used by one
 * thread at a time, except klein_session_cancel, which any thread may call while a
 * generation runs. Several sessions may share one model; their generations on that model run
 * one after another (the model's memory plan and paging are per model), sessions over
 * different models run in parallel. The same parameters give the same pixels whatever the
 * thread count, and the same pixels as `klein generate`.
 *
 * Fields are only ever added at the end of the structs, and every struct has an _init
 * function that sets the defaults: call it before setting fields, so that a program built
 * against an older header keeps its meaning.
 *
 * Errors: functions return a klein_status; the message is in *error (klein_model_open,
 * klein_session_new, klein_image_save; free it with klein_string_free) or
 * klein_session_error(session) (klein_generate). Nothing in this library exits, aborts or
 * prints.
 */
#ifndef KLEIN_KLEIN_H
#define KLEIN_KLEIN_H

#include <stddef.h>
#include <stdint.h>

#if defined(KLEIN_BUILDING_LIBRARY)
#define KLEIN_API __attribute__((visibility("default")))
#else
#define KLEIN_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef enum klein_status {
  KLEIN_OK = 0,
  KLEIN_ERROR = 1,            /* bad input or a failure; the message says which */
  KLEIN_ERROR_CANCELLED = 2,  /* the progress callback or klein_session_cancel stopped it */
  KLEIN_ERROR_ARGUMENT = 3,   /* a NULL handle or an option out of range */
  KLEIN_ERROR_FLAGGED = 4     /* the safety check flagged an input or the generated image
                                 (params.safety_model; the message names the nsfw probability
                                 and the threshold), or the prompt check the prompt
                                 (params.check_prompt); no image is given */
} klein_status;

typedef enum klein_precision {
  KLEIN_PRECISION_AUTO = 0,  /* fast for Q8/Q4 containers, exact otherwise */
  KLEIN_PRECISION_EXACT = 1, /* float32 activations throughout */
  KLEIN_PRECISION_FAST = 2   /* bf16 tiles for the transformer and the VAE on CPUs with AMX */
} klein_precision;

typedef enum klein_safety_action {
  KLEIN_SAFETY_REFUSE = 0, /* a flagged generated image: KLEIN_ERROR_FLAGGED, no image */
  KLEIN_SAFETY_BLUR = 1    /* a flagged generated image is given strongly blurred; its
                              metadata says why */
} klein_safety_action;

typedef enum klein_residency {
  KLEIN_RESIDENCY_AUTO = 0,     /* the default: paged */
  KLEIN_RESIDENCY_PAGED = 1,    /* one block or layer at a time */
  KLEIN_RESIDENCY_RESIDENT = 2  /* each network stays mapped while it runs */
} klein_residency;

/* The library's version, e.g. "0.1.0 (commit abc1234)". */
KLEIN_API const char* klein_version(void);

/* Frees a string the library returned (error messages). NULL is ignored. */
KLEIN_API void klein_string_free(char* s);

/* ---- models ------------------------------------------------------------------------------ */

typedef struct klein_model klein_model;

typedef struct klein_model_options {
  /* Single files instead of (or overriding parts of) the model path; NULL for none. */
  const char* diffusion_model; /* transformer safetensors (BFL, ComfyUI or diffusers names) */
  const char* text_encoder;    /* Qwen3 safetensors or its .index.json */
  const char* vae;             /* VAE safetensors */
  const char* tokenizer;       /* directory with vocab.json, merges.txt, tokenizer_config.json */
} klein_model_options;

KLEIN_API void klein_model_options_init(klein_model_options* options);

/* Opens and checks a model: `path` is a klein container or a diffusers directory (or NULL
 * when options name single files). options may be NULL. */
KLEIN_API klein_status klein_model_open(const char* path, const klein_model_options* options,
                                        klein_model** model, char** error);
KLEIN_API void klein_model_free(klein_model* model);
/* The configuration's name, e.g. "klein-4b". Valid while the model is open. */
KLEIN_API const char* klein_model_name(const klein_model* model);

/* ---- sessions ---------------------------------------------------------------------------- */

typedef struct klein_session klein_session;

typedef struct klein_session_options {
  int threads;                 /* worker threads; 0: the usable CPUs */
  uint64_t max_memory;         /* budget in bytes; 0: the available memory less a margin */
  klein_residency residency;
  klein_precision precision;
  const char* prompt_cache_dir; /* contexts cached per prompt here; NULL: no cache */
} klein_session_options;

KLEIN_API void klein_session_options_init(klein_session_options* options);

/* A session over `model` (which must outlive it). options may be NULL.
 * Memory: the library leaves the process's allocator alone. With glibc, freed blocks below its
 * adaptive mmap threshold (up to 32 MiB) stay in the heap, which raises the peak of a 512x512
 * generation by ~130 MiB; a program that wants the klein CLI's figures calls
 * mallopt(M_MMAP_THRESHOLD, 1 << 20) once at start (<malloc.h>), as the CLI does. */
KLEIN_API klein_status klein_session_new(klein_model* model, const klein_session_options* options,
                                         klein_session** session, char** error);
KLEIN_API void klein_session_free(klein_session* session);

/* The message of the last failed klein_generate on this session ("" if none). Valid until
 * the next call on the session. */
KLEIN_API const char* klein_session_error(const klein_session* session);

/* Asks the running generation to stop (from any thread); it returns KLEIN_ERROR_CANCELLED at
 * its next check (between transformer blocks, text-encoder layers, VAE blocks). */
KLEIN_API void klein_session_cancel(klein_session* session);

/* ---- generating -------------------------------------------------------------------------- */

typedef struct klein_progress {
  const char* phase; /* "load references", "text encoder", "vae encode", "denoise", "vae decode" */
  int done;          /* steps of the phase done (denoise: steps; vae encode: references) */
  int total;         /* 0 when the phase has no steps */
  double seconds;    /* since the phase began */
} klein_progress;

/* Called on the generating thread when a phase begins, after each step and when it ends.
 * Return non-zero to cancel the generation. */
typedef int (*klein_progress_fn)(const klein_progress* progress, void* user_data);

/* A preview of the image forming, after each denoising step: RGB, 8 bits a channel, one pixel
 * per 8x8 of the image (width/8 x height/8), from the latents without the VAE (a quick look,
 * not the final colours). Valid only during the call. Return non-zero to cancel. */
typedef struct klein_preview {
  int step, steps; /* 1-based step just done, of steps */
  int width, height;
  const uint8_t* pixels; /* width * height * 3 bytes, row-major */
} klein_preview;
typedef int (*klein_preview_fn)(const klein_preview* preview, void* user_data);

typedef struct klein_generate_params {
  const char* prompt;          /* required; "" is the empty prompt (unconditional, as the
                                  official pipelines take it) */
  const char* negative_prompt; /* with classifier-free guidance (klein-base with guidance > 1,
                                  Z-Image with guidance > 0) only; NULL: "" */
  int width, height;           /* pixels, multiples of 16; 0: the first reference's, else 1024 */
  int steps;                   /* 0: the model's default (4 for klein, 50 for klein-base,
                                  8 for Z-Image) */
  float guidance;              /* < 0: the model's default (1 for klein, 4 for klein-base,
                                  0 for Z-Image) */
  uint64_t seed;               /* used when has_seed != 0; otherwise drawn at random, < 2^32 */
  int has_seed;
  const char* const* references; /* image files for editing, in order; NULL or count 0 */
  int reference_count;
  klein_progress_fn progress;    /* may be NULL */
  void* user_data;               /* passed to progress */
  /* Editing from an image (as `klein generate --init-image --mask --strength`): */
  const char* init_image; /* image file: image-to-image, or inpainting with mask; NULL: none */
  const char* mask;       /* image file, white repaints, black keeps; needs init_image */
  float strength;         /* (0, 1] of the schedule to run; 0: the default 0.8 */
  klein_preview_fn preview; /* may be NULL; called on the generating thread, gets user_data */
  /* LoRAs of the transformer (as `klein generate --lora FILE:SCALE`), applied in order: */
  const char* const* loras; /* safetensors files; NULL when lora_count is 0 */
  const float* lora_scales; /* one per file; NULL: all 1 */
  int lora_count;
  /* Z-Image with guidance > 0 (ZImagePipeline's options; FLUX.2-klein refuses them): */
  float cfg_normalization; /* < 0: not given (off); c >= 0: the guided prediction is scaled
                              back to c x the positive one's norm when longer (0: off) */
  float cfg_truncation;    /* NAN: not given (1); steps whose model time (0 at noise, rising
                              to 1) is above it run unguided */
  int no_watermark; /* non-zero: no invisible mark on the pixels (by default every image of
                       at least 256x256 pixels carries the dwtDct mark with FLUX's message) */
  /* The safety check of BFL's FLUX.2 reference (as `klein generate --safety`): the input
   * images (references, init image) are classified before any work and the generated image
   * after decoding; an image whose nsfw probability is strictly above the threshold is
   * flagged: KLEIN_ERROR_FLAGGED (a flagged input always; the output unless safety_action is
   * KLEIN_SAFETY_BLUR). The verdicts are in the image's metadata ("safety"). */
  const char* safety_model; /* the classifier's Hugging Face directory
                               (Falconsai/nsfw_image_detection), opened once per session and
                               path; NULL: no checks */
  float safety_threshold;   /* in [0, 1]; < 0: 0.85 (BFL's; what klein_generate_params_init
                               sets) */
  klein_safety_action safety_action;
  /* Z-Image's ControlNet (as `klein generate --controlnet --control-image --control-scale`;
   * with init_image and mask, inpainting guided by it): */
  const char* controlnet;    /* the control model (Z-Image-Turbo-Fun-Controlnet-Union 2.1: a
                                diffusers directory or the original .safetensors); NULL: the
                                container's, if it holds one */
  const char* control_image; /* image file the generation follows; needs controlnet, or a
                                container that holds one (klein convert --controlnet) */
  float control_scale;       /* NAN: not given (0.75, controlnet_conditioning_scale) */
  /* The tiny autoencoder (as `klein generate --tiny-vae --decoder tiny --preview-size`): */
  const char* tiny_vae; /* its decoder (taef2_decoder.pth for FLUX.2, taef1_decoder.pth for
                           Z-Image, or a .safetensors copy), opened once per session and path:
                           the preview callback gets its pictures; NULL: the container's
                           (klein convert --tiny-vae), else none (the colour fit) */
  int tiny_decode;      /* non-zero: the tiny decoder decodes the image instead of the VAE */
  int preview_size;     /* longest side of its previews in pixels, 8 to 8192; 0: 256 */
  /* BFL's prompt check (as `klein generate --check-prompt`): non-zero asks the text encoder,
   * run as a language model (a container made with --keep-llm, or the diffusers directory),
   * whether the prompt names copyrighted characters, brands or living public figures before
   * any work; a flagged prompt: KLEIN_ERROR_FLAGGED, no image. */
  int check_prompt;
  /* Step caching (as `klein generate --cache`): "first-block:T", diffusers' FirstBlockCache
   * with threshold T (Z-Image; FLUX.2 refuses it); NULL: off. */
  const char* cache;
} klein_generate_params;

KLEIN_API void klein_generate_params_init(klein_generate_params* params);

typedef struct klein_image {
  int width, height;
  int channels;        /* 3: RGB, row-major, 8 bits a channel */
  uint8_t* pixels;     /* width * height * channels bytes */
  uint64_t seed;       /* the seed that made the noise */
  int steps;
  float guidance;
  const char* parameters; /* the A1111-style parameters text `klein generate` stores */
  const char* metadata;   /* the same as JSON */
} klein_image;

/* Generates one image. On KLEIN_OK *image holds it (free with klein_image_free). */
KLEIN_API klein_status klein_generate(klein_session* session, const klein_generate_params* params,
                                      klein_image** image);
KLEIN_API void klein_image_free(klein_image* image);

/* Generates `count` images of the same parameters (1 to 1000), image i with seed + i (seed:
 * params->seed with has_seed, else drawn at random), denoised together: each transformer
 * block is read once per step for all of them (as many at a time as the memory budget
 * holds). images[i] is the image klein_generate makes with seed + i. On KLEIN_OK
 * images[0..count) hold them (free each with klein_image_free); otherwise none is set.
 * params->preview sees the first image's steps. */
KLEIN_API klein_status klein_generate_batch(klein_session* session,
                                            const klein_generate_params* params, int count,
                                            klein_image** images);

/* Writes the image as PNG (or JPEG for .jpg / .jpeg, quality 95) with its metadata, atomically
 * (a failed save leaves no file). */
KLEIN_API klein_status klein_image_save(const klein_image* image, const char* path, char** error);

#ifdef __cplusplus
}
#endif

#endif /* KLEIN_KLEIN_H */
