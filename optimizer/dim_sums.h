// Sums of named dims: `past_sequence + sequence` is the key length of a decoder with a cache, both as
// the Concat of the past and the new keys makes it and as Add(Shape(past)[2], Shape(ids)[1]) counts
// it for the mask. Writing every sum one way (terms by name, then the number) makes the two the same
// dim_param, so "same dim" checks downstream (a mask's key length against the scores') see it.
#ifndef ONNXOPT_OPTIMIZER_DIM_SUMS_H_
#define ONNXOPT_OPTIMIZER_DIM_SUMS_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/strings/string_view.h"

namespace onnxopt {

// coefficient x symbol for each term, plus a number; no term has coefficient 0.
struct DimSum {
  std::map<std::string, int64_t, std::less<>> terms;
  int64_t constant = 0;

  static DimSum Number(int64_t value) { return {{}, value}; }
  // A dim_param: a sum as this file spells one ("a + b - 1", "2*a + b"; as Optimum names its presents,
  // "past_sequence_length + 1"), else one symbol of that name.
  static DimSum Parse(absl::string_view param);

  // `this` + sign * `other`.
  DimSum Plus(const DimSum& other, int64_t sign = 1) const;
  bool IsNumber() const { return terms.empty(); }
  // The dim_param of a sum with terms: the one symbol's name where it is only that, else the terms by
  // name with their signs and the number last.
  std::string Spell() const;
};

}  // namespace onnxopt

#endif  // ONNXOPT_OPTIMIZER_DIM_SUMS_H_
