#!/usr/bin/env bash
# Runs the test suite on the build made by scripts/setup.sh.
#   scripts/test.sh              the Release build in ./build
#   scripts/test.sh --sanitize [LABELS]   builds ./build-asan (clang, AddressSanitizer + UBSan:
#                                scripts/configure-sanitize.sh) and runs the tests there
#                                (LABELS: a ctest -L regex of test areas, e.g. 'formats|gguf';
#                                default: all but the end-to-end repeats listed below)
# Golden data is read from ../shared/testdata (override with KLEIN_TESTDATA=DIR).
set -euo pipefail
cd "$(dirname "$0")/.."

dir=build
if [[ "${1:-}" == "--sanitize" ]]; then
  dir=build-asan
  bash scripts/configure-sanitize.sh "$dir"
  # Leak checking is off: OpenBLAS keeps per-thread buffers until exit by design.
  export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
fi
# The browser the web page's test drives (tests/server), Python for the reference merge of
# the LoRA tests (tools/lora), numpy for the fp8 fixtures (tools/fp8), and Pillow, pytest and
# venv for the Python package's tests (python/tests), and exiftool to read the images' XMP
# back (tests/cli/provenance_test.cpp), from Debian.
bash scripts/install-packages.sh chromium python3 python3-numpy python3-pil python3-pytest python3-venv \
  libimage-exiftool-perl
[[ -f "$dir/build.ninja" ]] || { echo "no build in ./$dir: run scripts/setup.sh first" >&2; exit 1; }
cmake --build "$dir"
labels=()
if [[ "${1:-}" == "--sanitize" ]]; then
  # Not the five end-to-end quantization reports of klein and the three of Z-Image that mirror
  # them: each converts and generates a tiny model a dozen times through the same converter,
  # pipeline and kernels that the other tests run under the sanitizers, and klein's five took
  # 270 of the 1400 test seconds. The report's own code (metrics, writers, policy search, both
  # families' probes) is run by the other 24 report tests.
  # Nor two end-to-end repeats of paths other tests run under the sanitizers: the GGUF
  # generation comparison (four conversions and generations of the tiny model, 55 s here; the
  # GGUF reader and converter run under ASan in GgufModel.ConvertedHoldsTheValuesGgufPyDecodes
  # and BflLayout.Gguf*) and klein-base's 50-step defaults case (27 s; its CFG path runs in the
  # 6-step case).
  # Nor the batch-against-alone comparisons on the scalar path (240 of the stage's 1350
  # test-seconds: the tiny model denoised a dozen times through instrumented scalar loops);
  # the same batch code runs under the sanitizers on every vector path, and the scalar kernels
  # in the matmul and gemm tests.
  # Nor, for the same reason, the scalar instances of the language model's greedy runs (all
  # but one short case, untied_eos: 68 of the stage's 1250 test-seconds on a Zen 4 VM) and of
  # FLUX.2-dev's transformer and text encoder (16 s), nor the two real-shape banded VAE
  # comparisons (60 s, and the last tests to finish): their band code is the one the small
  # banded comparisons (VaeGolden, BandedVae) run under the sanitizers.
  # Nor five more end-to-end repeats (about 130 of the stage's test-seconds): FP8's direct
  # generation in two of its three scale conventions (their decoding runs under the sanitizers
  # in each convention's conversion test, the direct path in the third), Z-Image's 50-step
  # defaults with CFG (as klein-base's), the Q8/Q4 precision bounds (the quantized containers
  # run in LoraOnContainer and the kernels in test_quant), the report over an FP8 reference
  # (the report's code runs in 24 other tests), and the second LoRA-against-merge case.
  # Nor eight more end-to-end runs whose paths other end-to-end tests take under the sanitizers
  # (about 150 of the e2e area's 675 test-seconds on a 2-core Zen 5 VM): the first LoRA-against-
  # merge case (a LoRA at run time beside quantized weights: LoraOnContainer), Z-Image's LoRA
  # merged by convert (LoraMergedByConvert; its key spellings in ZImageLora.EverySpelling...),
  # Z-Image's container through tokenize/encode-text (ZImageCli.ContainerGivesTheSameGeneration
  # reads the same container's tokenizer and text encoder), the container with vocab.json and
  # merges.txt (every convert_tiny container: ContainerCli.ConvertVerifyGenerateMatchesTheSource),
  # FP8's --keep (the conversion of each FP8 convention), a batch of two (the sixteen of the
  # budget-groups test), the empty prompt's image (its encoding in EmptyPromptCli.ZImage...), and
  # the 9B-shaped container (the tiny model's containers).
  # Nor, on CPUs with AVX-512, the AVX-512 instances of the model-level per-ISA comparisons
  # (the batch denoising and the language model's greedy and sampled runs: about 70 of the
  # stage's test-seconds on a 2-core Zen 5 VM): their AVX2 instances run the same model code
  # under the sanitizers on every x86 CPU, and the AVX-512 kernels they call run instrumented
  # in test_quant and test_ops; the Release suite runs every instance.
  # Nor the scalar instance of the tiny decoder's band comparison (100 of the stage's test-
  # seconds on a 2-core Zen 5 VM, against 8 in the Release tree): the band code is the model's,
  # which its AVX2 and AVX-512 instances run under the sanitizers, and the scalar convolution
  # runs there in test_ops.
  # Nor the scalar and AVX-512 instances of FLUX.2-dev's upsampling replay (UpsampleMistral:
  # the same reasons as the Qwen3 language model's above; its AVX2 instances stay).
  # Nor the studio page's browser tests (Studio.*): what they test is the page's script, which
  # no sanitizer sees; the server paths they take (jobs carrying references, an init image, a
  # mask and a control image) run under the sanitizers in test_server's Serve tests.
  # (Parameterized tests are named by their name generator alone, "Suite/Test.Name/param":
  # tests/CMakeLists.txt discovers them with NO_PRETTY_VALUES, so a pattern ends in "$".)
  labels=(-E '^Conventions/Fp8Checkpoint[.]GeneratesTheReferenceImage/(comfy_scaled|e5m2)$|^ZImageCli[.]VariantPicksTheDefaults$|^ContainerCli[.]QuantizedGenerationsStayWithinTheirBounds$|^Fp8Fixtures[.]ReportTakesItAsTheReference$|^TinyModel/LoraMatchesMerge[.]AtEveryStep/bfl_negative$|^UpsampleTiny/LanguageModelIsa[.][A-Za-z]+/(long|t2i|t2i_think|t2i_sample_icdf|non_ascii|edit|untied_sample_torch)_scalar$|^Isas/DevTransformerIsa[.][A-Za-z]+/scalar$|^Cases/DevTextEncoder[.][A-Za-z]+/[a-z_]+_scalar$|^VaeRealShapes[.]Banded(Encode|Decode)MatchesWholeImage$|^Isa/BatchDenoise[.][A-Za-z0-9]+/(scalar|avx512)$|^Isa/TinyAutoencoder[.]BandedDecodeHasTheWholeDecodesBits/scalar$|^UpsampleTiny/LanguageModelIsa[.][A-Za-z]+/[a-z0-9_]+_avx512$|^(TinyReport[.](CliReportsQ8AndQ4|CliPolicyIsVerifiedAndConvertAcceptsIt|EndToEndQ8IsCloserThanQ4|PolicySearch|EndToEndPsnrIsThatOfTwoDefaultGenerations)|ZImageReport[.](EndToEndQ8IsCloserThanQ4|EndToEndPsnrIsThatOfTwoDefaultGenerations|CliReportsAndVerifiesAPolicy)|GgufModel[.]ConvertedGivesTheGenerationOfItsDecodedWeights)$|^TinyModel/KleinBase[.]MatchesTheOfficialPipelineAtEveryStep/base_defaults_h48_w48$|^TinyModel/LoraMatchesMerge[.]AtEveryStep/all$|^(ZImageLora[.]MergedByConvertMatchesTheReferenceMerge|FamilyText[.]ZImageContainerGivesTheSame|TokenizeCli[.]ContainerFromVocabAndMerges|Fp8Fixtures[.]KeepKeepsEachTensorsPrecisionClass|Batch[.]BatchImagesAreTheImagesMadeAloneWithTheNextSeeds|EmptyPromptCli[.]MakesADeterministicImageOfItsOwn|NineBContainer[.]KeepsOnlyWhatInferenceReadsAndGeneratesTheSame)$|^Studio[.]|^UpsampleMistral/DevUpsampleIsa[.][A-Za-z]+/[a-z0-9_]+_(scalar|avx512)$')
  if [[ -n "${2:-}" ]]; then
    labels=(-L "$2")
  else
    # Each pattern above must leave out at least one test: one that matches nothing (a renamed
    # test, a change in how ctest names them) would put its tests back in the suite unseen.
    unmatched=$(ctest --test-dir "$dir" -N | sed -n 's/^ *Test *#[0-9]*: //p' |
      python3 -c '
import re, sys
pattern, names = sys.argv[1], sys.stdin.read().split()
alternatives, depth, start = [], 0, 0
for i, c in enumerate(pattern):
    depth += (c == "(") - (c == ")")
    if c == "|" and depth == 0:
        alternatives.append(pattern[start:i])
        start = i + 1
alternatives.append(pattern[start:])
print("\n".join(a for a in alternatives if not any(re.search(a, n) for n in names)))
' "${labels[1]}")
    if [[ -n "$unmatched" ]]; then
      echo "scripts/test.sh: these patterns of the sanitizer suite's left-out tests match no test:" >&2
      echo "$unmatched" >&2
      exit 1
    fi
  fi
fi
# Which instruction-set paths the run exercised: the tests append "ran PATH TEST" or "skipped
# PATH TEST" to this file (tests/support/isa.h), summed up below.
export KLEIN_TEST_ISA_LOG="$PWD/$dir/Testing/isa-paths.log"
mkdir -p "$dir/Testing"
rm -f "$KLEIN_TEST_ISA_LOG"
rc=0
ctest --test-dir "$dir" --output-on-failure --timeout 900 -j "$(nproc)" "${labels[@]}" || rc=$?
bash scripts/isa-summary.sh "$KLEIN_TEST_ISA_LOG"
exit "$rc"
