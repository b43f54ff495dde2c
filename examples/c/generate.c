/* Generates one image with the klein C library, as `klein generate` would with the same
 * parameters and --no-cache (the same pixels).
 *
 *   cc examples/c/generate.c $(pkg-config --cflags --libs klein) -o generate
 *   ./generate MODEL PROMPT SEED WIDTH HEIGHT STEPS OUT.png
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include <klein/klein.h>

static int show_progress(const klein_progress* p, void* user_data) {
  (void)user_data;
  if (p->total > 0 && p->done > 0) fprintf(stderr, "%s: %d/%d\n", p->phase, p->done, p->total);
  return 0; /* non-zero would cancel */
}

/* A whole decimal number from `text`, or exits naming what was wrong. */
static unsigned long long number(const char* text, const char* what) {
  char* end = NULL;
  errno = 0;
  const unsigned long long value = strtoull(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || text[0] == '-') {
    fprintf(stderr, "%s: expected a whole number, got '%s'\n", what, text);
    exit(2);
  }
  return value;
}

int main(int argc, char** argv) {
  if (argc != 8) {
    fprintf(stderr, "usage: %s MODEL PROMPT SEED WIDTH HEIGHT STEPS OUT.png\n", argv[0]);
    return 2;
  }
  klein_generate_params params;
  klein_generate_params_init(&params);
  params.prompt = argv[2];
  params.seed = number(argv[3], "SEED");
  params.has_seed = 1;
  params.width = (int)number(argv[4], "WIDTH");
  params.height = (int)number(argv[5], "HEIGHT");
  params.steps = (int)number(argv[6], "STEPS");
  params.progress = show_progress;

  char* error = NULL;
  klein_model* model = NULL;
  if (klein_model_open(argv[1], NULL, &model, &error) != KLEIN_OK) {
    fprintf(stderr, "error: %s\n", error);
    klein_string_free(error);
    return 1;
  }
  klein_session* session = NULL;
  if (klein_session_new(model, NULL, &session, &error) != KLEIN_OK) {
    fprintf(stderr, "error: %s\n", error);
    klein_string_free(error);
    klein_model_free(model);
    return 1;
  }
  klein_image* image = NULL;
  int status = 0;
  if (klein_generate(session, &params, &image) != KLEIN_OK) {
    fprintf(stderr, "error: %s\n", klein_session_error(session));
    status = 1;
  } else if (klein_image_save(image, argv[7], &error) != KLEIN_OK) {
    fprintf(stderr, "error: %s\n", error);
    klein_string_free(error);
    status = 1;
  } else {
    printf("%s: %dx%d, seed %llu (klein %s)\n", argv[7], image->width, image->height,
           (unsigned long long)image->seed, klein_version());
  }
  klein_image_free(image);
  klein_session_free(session);
  klein_model_free(model);
  return status;
}
