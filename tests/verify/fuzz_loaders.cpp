// tests/verify/fuzz_loaders.cpp — libFuzzer target for the tensor-file loaders and the JSON
// reader: any input must either parse or throw oasis::invalid_argument (io::format_error) /
// json::parse_error; never crash, hang, read out of bounds (ASan) or allocate beyond the input
// size (the loaders check every size against the bytes present before allocating).
// Built with clang++ -fsanitize=fuzzer,address (tests/verify/CMakeLists.txt, scripts/fuzz-loaders.sh).
#include <cstddef>
#include <cstdint>
#include <string>

#include "oasis/io/json.hpp"
#include "oasis/io/npy.hpp"
#include "oasis/io/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  // The first byte picks the loader so that one corpus exercises all of them; the rest is the file.
  const int which = size ? data[0] % 4 : 0;
  const std::string body = size ? bytes.substr(1) : bytes;
  try {
    switch (which) {
      case 0: {
        const oasis::io::TensorMap m = oasis::io::parse_safetensors(body, "fuzz.safetensors");
        // A file that parses must round-trip through the writer.
        (void)oasis::io::parse_safetensors(oasis::io::serialize_safetensors(m), "roundtrip.safetensors");
        break;
      }
      case 1: {
        const oasis::io::StoredTensor t = oasis::io::parse_npy(body, "fuzz.npy");
        (void)oasis::io::parse_npy(oasis::io::serialize_npy(t, "roundtrip.npy"), "roundtrip.npy");
        break;
      }
      case 2: (void)oasis::io::parse_npy(body, "fuzz.bf16.npy"); break;
      default: (void)oasis::io::json::parse(body); break;
    }
  } catch (const oasis::invalid_argument&) {
  } catch (const oasis::io::json::parse_error&) {
  }
  return 0;
}
