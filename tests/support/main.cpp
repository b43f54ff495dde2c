// The test programs' main. ctest reads a test as skipped from its exit code alone (77, the
// SKIP_RETURN_CODE of tests/CMakeLists.txt): 77 when every test that ran was skipped and
// nothing failed, else GoogleTest's own result. ctest's default for GoogleTest reads a skip
// from the output instead, and so took a suite whose SetUpTestSuite threw (its tests print
// "[  SKIPPED ]") for a skipped one although the program failed.
#include <gtest/gtest.h>

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const int result = RUN_ALL_TESTS();
  const ::testing::UnitTest& unit = *::testing::UnitTest::GetInstance();
  if (result == 0 && unit.skipped_test_count() > 0 && unit.successful_test_count() == 0 &&
      unit.failed_test_count() == 0)
    return 77;
  return result;
}
