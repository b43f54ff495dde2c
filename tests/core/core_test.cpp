#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>
#include <thread>

#include "core/dtype.h"
#include "core/error.h"
#include "core/files.h"
#include "core/npy.h"
#include "core/plane.h"
#include "core/threadpool.h"
#include "support/build_tree.h"
#include "support/testing.h"

namespace klein {
namespace {

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  // 1 + 2^-8 is exactly between two bf16 values: ties go to the even one (1.0).
  EXPECT_EQ(f32_to_bf16(1.00390625f), 0x3f80);
  // 1 + 3*2^-8 is between 1+2^-7 (odd) and 1+2^-6 (even): rounds up to even.
  EXPECT_EQ(f32_to_bf16(1.01171875f), 0x3f82);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(bf16_to_f32(0xc000), -2.0f);
}

TEST(DType, F16RoundTripsEveryHalf) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    float f = f16_to_f32(uint16_t(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_f16(f), h) << "half bits " << h;
  }
}

TEST(DType, F16KnownValues) {
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);               // largest finite
  EXPECT_EQ(f32_to_f16(70000.0f), 0x7c00);               // overflows to inf
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);  // tie to even: zero
  EXPECT_EQ(f32_to_f16(std::ldexp(3.0f, -26)), 0x0001);  // above the tie: rounds up
}

TEST(DType, BulkConversionsMatchScalar) {
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.f, 100.f);
  std::vector<float> src(1003);
  for (auto& v : src) v = dist(rng);
  std::vector<uint16_t> h(src.size()), b(src.size());
  f32_to_f16(src.data(), h.data(), src.size());
  f32_to_bf16(src.data(), b.data(), src.size());
  std::vector<float> back_h(src.size()), back_b(src.size());
  f16_to_f32(h.data(), back_h.data(), src.size());
  bf16_to_f32(b.data(), back_b.data(), src.size());
  for (size_t i = 0; i < src.size(); ++i) {
    ASSERT_EQ(h[i], f32_to_f16(src[i])) << i;
    ASSERT_EQ(b[i], f32_to_bf16(src[i])) << i;
    ASSERT_EQ(back_h[i], f16_to_f32(h[i])) << i;
    ASSERT_EQ(back_b[i], bf16_to_f32(b[i])) << i;
  }
}

// Tensor data of a file can start at any byte (safetensors offsets are not aligned): bulk
// conversions from an odd address give the same values (and no misaligned loads under UBSan;
// found by fuzz/fuzz_safetensors).
TEST(DType, BulkConversionsFromOddAddresses) {
  for (DType t : {DType::BF16, DType::F16}) {
    std::vector<uint16_t> halves(3000);
    for (size_t i = 0; i < halves.size(); ++i) halves[i] = uint16_t(0x3c00 + i % 977);
    std::vector<std::byte> odd(halves.size() * 2 + 1);
    std::memcpy(odd.data() + 1, halves.data(), halves.size() * 2);
    std::vector<float> from_odd(halves.size()), from_aligned(halves.size());
    to_f32(t, odd.data() + 1, from_odd.data(), halves.size());
    to_f32(t, halves.data(), from_aligned.data(), halves.size());
    EXPECT_EQ(from_odd, from_aligned) << dtype_name(t);
  }
}

TEST(ThreadPool, CoversEveryIndexOnce) {
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 7, 1000}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      pool.parallel_for(n, [&](int64_t b, int64_t e, int) {
        for (int64_t i = b; i < e; ++i) hits[size_t(i)]++;
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[size_t(i)].load(), 1);
    }
  }
}

// Many short loops back to back, as a step runs them: every task of every loop runs once,
// and a loop's results are all there when it returns (the workers that watch for the next
// loop and the caller that waits for the last task hand over correctly), including loops
// with fewer tasks than threads and pauses long enough for the workers to fall asleep.
TEST(ThreadPool, ShortLoopsBackToBack) {
  for (int threads : {2, 4}) {
    ThreadPool pool(threads);
    std::vector<int> out(8);
    for (int loop = 0; loop < 20000; ++loop) {
      const int n = 1 + loop % 8;
      pool.for_each_task(n, [&](int64_t t, int) { out[size_t(t)] = loop; });
      for (int t = 0; t < n; ++t) ASSERT_EQ(out[size_t(t)], loop) << threads << " threads";
      if (loop % 5000 == 4999)
        std::this_thread::sleep_for(std::chrono::microseconds(3 * ThreadPool::kSpinMicroseconds));
    }
  }
}

TEST(ThreadPool, RethrowsTaskErrors) {
  ThreadPool pool(2);
  EXPECT_THROW(pool.for_each_task(10,
                                  [](int64_t t, int) {
                                    if (t == 5) fail("task 5 failed");
                                  }),
               Error);
  // The pool stays usable afterwards.
  std::atomic<int> count = 0;
  pool.for_each_task(10, [&](int64_t, int) { count++; });
  EXPECT_EQ(count.load(), 10);
}

TEST(Npy, RoundTripsAndReadsGoldenFiles) {
  auto dir = testing::temp_dir("npy");
  std::vector<int64_t> ids = {1, -2, 3, 151643};
  write_npy(dir / "ids.npy", DType::I64, {2, 2}, ids.data());
  NpyArray a = read_npy(dir / "ids.npy");
  EXPECT_EQ(a.shape, (Shape{2, 2}));
  EXPECT_EQ(a.to_i64(), ids);

  NpyArray ref = read_npy(testing::tiny_vectors() / "tokenizer" / "prompt0_input_ids.npy");
  EXPECT_EQ(ref.dtype, DType::I64);
  EXPECT_EQ(ref.shape, (Shape{512}));
  EXPECT_EQ(ref.to_i64()[0], 151644);  // <|im_start|>
}

TEST(Npy, RejectsMalformedFiles) {
  auto dir = testing::temp_dir("npy-bad");
  {
    AtomicFile f(dir / "junk.npy");
    f.write("not an array");
    f.commit();
  }
  EXPECT_THROW(read_npy(dir / "junk.npy"), Error);
  EXPECT_THROW(read_npy(dir / "missing.npy"), Error);
}

// The shape must be non-negative whole numbers that the data can hold: a minus sign, a huge
// dimension or a product past the file's size is refused (no overflow, no huge allocation).
TEST(Npy, RejectsBadShapes) {
  const auto dir = testing::temp_dir("npy-shapes");
  auto write = [&](const std::string& name, const std::string& shape, size_t data_bytes) {
    std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + shape + "), }";
    while ((10 + header.size() + 1) % 64) header += ' ';
    header += '\n';
    std::string file = std::string("\x93NUMPY\x01\x00", 8);
    file += char(header.size() & 255);
    file += char(header.size() >> 8);
    file += header;
    file += std::string(data_bytes, '\0');
    AtomicFile f(dir / name);
    f.write(file);
    f.commit();
    return dir / name;
  };
  EXPECT_EQ(read_npy(write("good.npy", "2, 3", 24)).shape, (Shape{2, 3}));
  EXPECT_EQ(read_npy(write("one.npy", "4,", 16)).shape, (Shape{4}));
  // No elements: an empty array (the parser fuzzer found a memcpy into an empty vector's null
  // data here; the sanitizer stage of the tests catches a regression).
  const NpyArray empty = read_npy(write("empty.npy", "0, 2, 7777777777777777", 0));
  EXPECT_EQ(empty.shape, (Shape{0, 2, 7777777777777777}));
  EXPECT_TRUE(empty.bytes.empty());
  for (const auto& [name, shape] :
       std::vector<std::pair<std::string, std::string>>{{"negative.npy", "-2, 3"},
                                                        {"huge.npy", "4611686018427387904, 4"},
                                                        {"product.npy", "4294967296, 4294967296"},
                                                        {"words.npy", "two, 3"},
                                                        {"long.npy", "99999999999999999999999"}}) {
    try {
      read_npy(write(name, shape, 24));
      ADD_FAILURE() << name << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
  }
}

// A plane in memory and one in scratch files hold the same values after the same writes:
// bands of rows in, bands and flat spans out (a span across channels, and so across files);
// the files leave no name. The channels spread over 1, 2 or 3 files (at most one per channel).
class PlaneFiles : public ::testing::TestWithParam<int> {};

TEST_P(PlaneFiles, FileAndMemoryHoldTheSameValues) {
  const std::filesystem::path dir = testing::temp_dir("plane");
  ThreadPool pool(2);
  Plane memory(3, 10, 7), file(3, 10, 7, dir.string(), GetParam());
  EXPECT_FALSE(memory.in_file());
  EXPECT_TRUE(file.in_file());
  EXPECT_EQ(file.files(), std::min(GetParam(), 3));
  EXPECT_TRUE(std::filesystem::is_empty(dir));  // created unlinked
  Tensor band({3, 5, 7});
  for (int64_t i = 0; i < band.numel(); ++i) band.data()[i] = float(i) + 0.5f;
  for (Plane* p : {&memory, &file}) {
    p->write(band, 1, 3, 2, &pool);  // band rows 1..3 -> plane rows 2..4
    p->write(band, 0, 2, 8);         // band rows 0..1 -> plane rows 8..9
  }
  for (const Plane* p : {&memory, &file}) {
    const Tensor all = p->to_tensor();
    for (int64_t c = 0; c < 3; ++c)
      for (int64_t y = 0; y < 10; ++y)
        for (int64_t x = 0; x < 7; ++x) {
          if (y < 2 || (y > 4 && y < 8)) continue;  // not written: undefined
          const float got = all.data()[(c * 10 + y) * 7 + x];
          const float want =
              y <= 4 ? band.data()[(c * 5 + y - 1) * 7 + x] : band.data()[(c * 5 + y - 8) * 7 + x];
          ASSERT_EQ(got, want) << (p->in_file() ? "file" : "memory") << " c" << c << " y" << y;
        }
    const Tensor rows = p->rows(3, 9, &pool);
    ASSERT_EQ(rows.shape(), (Shape{3, 6, 7}));
    EXPECT_EQ(0,
              std::memcmp(rows.data() + 6 * 7, all.data() + (10 + 3) * 7, 6 * 7 * sizeof(float)));
    std::vector<float> buffer(100);
    const float* span = p->span(60, 25, buffer.data());
    EXPECT_EQ(0, std::memcmp(span, all.data() + 60, 25 * sizeof(float)));
    span = p->span(64, 100, buffer.data());  // channel 0's last rows to channel 2's first
    for (int64_t i = 0; i < 100; ++i) {
      const int64_t y = (64 + i) % 70 / 7;
      if (y >= 2 && y <= 4) {
        ASSERT_EQ(span[i], all.data()[64 + i]) << i;
      }
    }
  }
  Plane moved = std::move(file);
  EXPECT_TRUE(moved.in_file());
  EXPECT_EQ(moved.rows(2, 3).data()[0], band.data()[7]);
  EXPECT_THROW(moved.rows(4, 11), Error);
  EXPECT_THROW(moved.write(band, 0, 5, 7), Error);  // past the last row
}

INSTANTIATE_TEST_SUITE_P(Files, PlaneFiles, ::testing::Values(1, 2, 3, 8));

TEST(Plane, NamesAMissingScratchDirectory) {
  try {
    Plane p(2, 2, 2, "/nonexistent/klein-scratch");
    FAIL() << "a plane was made in a missing directory";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/klein-scratch"), std::string::npos)
        << e.what();
  }
}

// A plane asked for more files than the process may open takes the ones it can; with none
// left at all, the error says so.
TEST(Plane, FewerFilesWhenOutOfDescriptors) {
  const std::filesystem::path dir = testing::temp_dir("plane-fds");
  // The two lowest free descriptors: with the limit just above the second, two files open.
  const int first = ::dup(0), second = ::dup(0);
  ASSERT_GE(first, 0);
  ASSERT_GT(second, first);
  ::close(first);
  ::close(second);
  struct rlimit saved {};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &saved), 0);
  auto limit_to = [&](int n) {
    struct rlimit l = saved;
    l.rlim_cur = rlim_t(n);
    ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &l), 0);
  };
  limit_to(second + 1);
  {
    Plane p(3, 10, 7, dir.string(), 8);
    EXPECT_EQ(p.files(), 2);
    Tensor band({3, 10, 7});
    for (int64_t i = 0; i < band.numel(); ++i) band.data()[i] = float(i);
    p.write(band, 0, 10, 0);
    const Tensor back = p.to_tensor();
    EXPECT_EQ(0, std::memcmp(back.data(), band.data(), size_t(band.numel()) * sizeof(float)));
  }
  // Not in the sanitizer build: with no descriptor free, UBSan's own check of the message's
  // stream (it probes memory through a pipe) fails and reports an invalid vptr.
  if (!testing::sanitized()) {
    limit_to(first);
    const std::string error = testing::error_of([&] { Plane(3, 10, 7, dir.string(), 8); });
    EXPECT_NE(error.find(dir.string()), std::string::npos) << error;
    EXPECT_NE(error.find("ulimit -n"), std::string::npos) << error;
  }
  ::setrlimit(RLIMIT_NOFILE, &saved);
}

// Before long work: a scratch directory that is missing, or has less room than asked, is
// named in the error; one with room passes and keeps no file.
TEST(Plane, ScratchSpaceIsCheckedUpFront) {
  const std::filesystem::path dir = testing::temp_dir("scratch-space");
  EXPECT_NO_THROW(check_scratch_space(dir.string(), 4096));
  EXPECT_TRUE(std::filesystem::is_empty(dir));
  for (const auto& [where, bytes] :
       {std::pair<std::string, uint64_t>{"/nonexistent/klein-scratch", 1},
        {dir.string(), uint64_t(1) << 62}}) {
    try {
      check_scratch_space(where, bytes);
      ADD_FAILURE() << where << " accepted for " << bytes << " bytes";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(where), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("TMPDIR"), std::string::npos) << e.what();
    }
  }
}

// A FIFO (or any special file) given as an input is refused at once instead of waiting for a
// writer forever.
TEST(Files, SpecialFilesAreRefusedWithoutWaiting) {
  const auto dir = testing::temp_dir("fifo");
  const auto fifo = dir / "pipe.npy";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_THROW(read_text_file(fifo), Error);
  EXPECT_THROW(MappedFile{fifo}, Error);
  try {
    read_npy(fifo);
    ADD_FAILURE() << "a FIFO was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not a regular file"), std::string::npos) << e.what();
  }
  EXPECT_THROW(read_text_file(dir), Error);  // a directory
}

TEST(AtomicFile, LeavesNothingWithoutCommit) {
  auto dir = testing::temp_dir("atomic");
  {
    AtomicFile f(dir / "out.bin");
    f.write("partial");
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir));
}

}  // namespace
}  // namespace klein
