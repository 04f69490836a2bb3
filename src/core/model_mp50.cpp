// Explicit instantiation of the model oracle for ::oasis::mp50 (see include/oasis/model/model.hpp).
#define OASIS_MODEL_INSTANTIATING
#include "oasis/model/decode.hpp"
#include "oasis/core/multiprecision.hpp"

template class oasis::model::Model<::oasis::mp50>;
template class oasis::model::Decoder<::oasis::mp50>;
