#pragma once
// A test suite over the tiny model's weights, opened once for the whole suite (header-only:
// only the test programs that link the weights library include it).
#include <gtest/gtest.h>

#include <memory>

#include "support/testing.h"
#include "weights/model_source.h"

namespace klein::testing {

class TinyModelSuite : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { store_ = open_model(tiny_model()); }
  static void TearDownTestSuite() { store_.reset(); }

  static inline std::unique_ptr<WeightStore> store_;
};

}  // namespace klein::testing
