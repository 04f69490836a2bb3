// src/python/model.hpp — the model held by a Python oasis.Model: its configuration and its weights
// as stored tensors (the dtype each weight came in, values exact), with the float and double
// models built from them on first use.
#pragma once

#include <memory>

#include "oasis/io/dtype.hpp"
#include "oasis/model/config.hpp"
#include "oasis/model/model.hpp"

namespace oasis::python {

struct HeldModel {
  model::ModelConfig config;
  io::TensorMap weights;
  std::shared_ptr<const model::Model<float>> f32;
  std::shared_ptr<const model::Model<double>> f64;
};

}  // namespace oasis::python
