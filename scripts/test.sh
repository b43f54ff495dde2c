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
  # Nor three more end-to-end repeats, the longest left in the e2e label on the 2-core AVX2
  # EPYC (about 40 of its test-seconds in the Release tree, three times that under the
  # sanitizers): convert's LoRA merge (LoraMergedByConvert; the adapters it merges are read and
  # applied under the sanitizers in LoraOnContainer), the batch in groups of the memory budget
  # (its plan in the pipeline area's memory tests, its batches in BatchDenoise and the C API's
  # batch test), and the container made from a tokenizer.json alone (the tokenizer.json reader
  # runs in the tokenizer area's fixtures, the container's tokenizer in every converted model).
  # Nor three tests measured as the longest left under the sanitizers on that EPYC (88 of the
  # suite's 1615 test-seconds): `klein bench matmul` at the real shapes (the products it times
  # run instrumented in test_quant), the server's load test (twelve clients; the queue, the 429
  # and the cancellation it takes run in the Serve tests, and its memory bound would measure
  # ASan's allocator), and the scalar instance of the Winograd convolution's comparison (its
  # driver runs under the sanitizers in the vector instances, the scalar transforms in the
  # Release suite and under qemu).
  # Nor the scalar instance of the prompt check against transformers (PromptCheckReference: 24
  # prefills of about 265 tokens; 114 of the suite's test-seconds on the 2-core AVX2 EPYC,
  # against 10 in the Release tree): the code it drives is the language model's, which its AVX2
  # and AVX-512 instances run under the sanitizers, and the scalar products run there in
  # test_quant.
  # (Parameterized tests are named by their name generator alone, "Suite/Test.Name/param":
  # tests/CMakeLists.txt discovers them with NO_PRETTY_VALUES, so a pattern ends in "$".)
  # The patterns are Python's regular expressions, matched against the names `ctest -N` lists,
  # and the suite is run by test number (ctest -I): ctest's own -E takes one expression of at
  # most nine groups, and one past that is an error it prints before running every test.
  left_out=(
    '^Conventions/Fp8Checkpoint[.]GeneratesTheReferenceImage/(comfy_scaled|e5m2)$'
    '^ZImageCli[.]VariantPicksTheDefaults$'
    '^ContainerCli[.]QuantizedGenerationsStayWithinTheirBounds$'
    '^Fp8Fixtures[.]ReportTakesItAsTheReference$'
    '^TinyModel/LoraMatchesMerge[.]AtEveryStep/bfl_negative$'
    '^UpsampleTiny/LanguageModelIsa[.][A-Za-z]+/(long|t2i|t2i_think|t2i_sample_icdf|non_ascii|edit|untied_sample_torch)_scalar$'
    '^Isas/DevTransformerIsa[.][A-Za-z]+/scalar$'
    '^Cases/DevTextEncoder[.][A-Za-z]+/[a-z_]+_scalar$'
    '^VaeRealShapes[.]Banded(Encode|Decode)MatchesWholeImage$'
    '^Isa/BatchDenoise[.][A-Za-z0-9]+/(scalar|avx512)$'
    '^Isa/TinyAutoencoder[.]BandedDecodeHasTheWholeDecodesBits/scalar$'
    '^UpsampleTiny/LanguageModelIsa[.][A-Za-z]+/[a-z0-9_]+_avx512$'
    '^(TinyReport[.](CliReportsQ8AndQ4|CliPolicyIsVerifiedAndConvertAcceptsIt|EndToEndQ8IsCloserThanQ4|PolicySearch|EndToEndPsnrIsThatOfTwoDefaultGenerations)|ZImageReport[.](EndToEndQ8IsCloserThanQ4|EndToEndPsnrIsThatOfTwoDefaultGenerations|CliReportsAndVerifiesAPolicy)|GgufModel[.]ConvertedGivesTheGenerationOfItsDecodedWeights)$'
    '^TinyModel/KleinBase[.]MatchesTheOfficialPipelineAtEveryStep/base_defaults_h48_w48$'
    '^TinyModel/LoraMatchesMerge[.]AtEveryStep/all$'
    '^(ZImageLora[.]MergedByConvertMatchesTheReferenceMerge|FamilyText[.]ZImageContainerGivesTheSame|TokenizeCli[.]ContainerFromVocabAndMerges|Fp8Fixtures[.]KeepKeepsEachTensorsPrecisionClass|Batch[.]BatchImagesAreTheImagesMadeAloneWithTheNextSeeds|EmptyPromptCli[.]MakesADeterministicImageOfItsOwn|NineBContainer[.]KeepsOnlyWhatInferenceReadsAndGeneratesTheSame)$'
    '^Studio[.]'
    '^(LoraMergedByConvert[.]MatchesTheReferenceMerge|Batch[.]ABatchTheBudgetDoesNotHoldGoesInGroupsOfTheSameImages|TokenizeCli[.]ContainerFromOnlyTokenizerJson)$'
    '^UpsampleMistral/DevUpsampleIsa[.][A-Za-z]+/[a-z0-9_]+_(scalar|avx512)$'
    '^(BenchMatmulCli[.]JsonHasEveryTypeAndShapeWithSgemmAlongside|ServeLoad[.]ExcessRequestsGet429TheQueueStaysBoundedAndMemoryFlat)$'
    '^Isa/Conv2dWinograd[.]MatchesDefinition/scalar$'
    '^Isa/PromptCheckReference[.][A-Za-z]+/scalar$'
  )
  if [[ -n "${2:-}" ]]; then
    labels=(-L "$2")
  else
    # Each pattern must leave out at least one test: one that matches nothing (a renamed test, a
    # change in how ctest names them) would put its tests back in the suite unseen.
    selection=$(ctest --test-dir "$dir" -N | python3 -c '
import re, sys
tests = [re.match(r"\s*Test\s+#(\d+): (\S+)", line) for line in sys.stdin]
tests = [(int(m.group(1)), m.group(2)) for m in tests if m]
patterns = sys.argv[1:]
unmatched = [p for p in patterns if not any(re.search(p, name) for _, name in tests)]
if unmatched or not tests:
    print("scripts/test.sh: these patterns of the sanitizer suite\x27s left-out tests match no test:",
          *unmatched, sep="\n", file=sys.stderr)
    sys.exit(1)
kept = [n for n, name in tests if not any(re.search(p, name) for p in patterns)]
print(f"{len(tests) - len(kept)} of {len(tests)} tests left out", file=sys.stderr)
print("0,0,0," + ",".join(map(str, kept)))
' "${left_out[@]}")
    labels=(-I "$selection")
  fi
fi
# Which instruction-set paths the run exercised: the tests append "ran PATH TEST" or "skipped
# PATH TEST" to this file (tests/support/isa.h), summed up below.
export KLEIN_TEST_ISA_LOG="$PWD/$dir/Testing/isa-paths.log"
mkdir -p "$dir/Testing"
rm -f "$KLEIN_TEST_ISA_LOG"
# What the test programs make once and then only read (the tiny model's containers, the
# scripts' tokenizer and LoRA fixtures: tests/support/testing.h, shared_fixture) is made once
# for the whole run here, by the first test that asks, instead of once per test process.
export KLEIN_TEST_FIXTURES="$PWD/$dir/Testing/fixtures"
rm -rf "$KLEIN_TEST_FIXTURES"
trap 'rm -rf "$KLEIN_TEST_FIXTURES"' EXIT
rc=0
ctest --test-dir "$dir" --output-on-failure --timeout 900 -j "$(nproc)" "${labels[@]}" || rc=$?
bash scripts/isa-summary.sh "$KLEIN_TEST_ISA_LOG"
exit "$rc"
