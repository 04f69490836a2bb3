// Explicit instantiation of the model oracle for float, double and long double
// (see include/oasis/model/model.hpp); oasis::mp50 is in model_mp50.cpp.
#define OASIS_MODEL_INSTANTIATING
#include "oasis/model/decode.hpp"

template class oasis::model::Model<float>;
template class oasis::model::Decoder<float>;
template class oasis::model::Model<double>;
template class oasis::model::Decoder<double>;
template class oasis::model::Model<long double>;
template class oasis::model::Decoder<long double>;
