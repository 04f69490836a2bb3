// src/verify/config_files.hpp — a compare configuration and the tensor files it names
// (docs/verify.md): reading the JSON (from a file, or from the "oasis_config" metadata entry of a
// .safetensors file) and the "inputs"/"outputs" sets. Called by the entry points (engine.cpp);
// calls only the readers of oasis/io.
#pragma once

#include <string>

#include "oasis/io/dtype.hpp"
#include "oasis/io/json.hpp"

namespace oasis::verify::detail {

/// A configuration as read from its file.
struct ConfigFile {
  io::json::Value cfg;
  std::string base_dir;      ///< the file's directory: relative paths are resolved against it
  std::string default_file;  ///< the .safetensors file itself (its tensors are the default sets), else empty
};

/// A JSON file, or a .safetensors file whose "__metadata__" holds the JSON under "oasis_config".
ConfigFile read_config_file(const std::string& path);

/// `p` relative to `base` (an absolute or empty p, or an empty base, as given).
std::string resolve_path(const std::string& base, const std::string& p);

/// The set "inputs" or "outputs" (`what`): a .safetensors path, or an object {tensor name: .npy
/// or .safetensors path}; absent, the tensors of `default_file` (an error when that is empty).
io::TensorMap load_tensor_set(const io::json::Value* spec, const std::string& base, const std::string& default_file,
                              const std::string& what);

}  // namespace oasis::verify::detail
