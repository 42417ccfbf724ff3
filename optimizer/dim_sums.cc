#include "optimizer/dim_sums.h"

#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace onnxopt {
namespace {

// "name", "3*name" or "7": adds it to `sum` with `sign`; false if it is none of those.
bool AddToken(absl::string_view token, int64_t sign, DimSum* sum) {
  if (token.empty()) return false;
  int64_t number = 0;
  if (absl::SimpleAtoi(token, &number)) {
    sum->constant += sign * number;
    return true;
  }
  int64_t coefficient = 1;
  const size_t star = token.find('*');
  if (star != absl::string_view::npos) {
    if (!absl::SimpleAtoi(token.substr(0, star), &coefficient)) return false;
    token = token.substr(star + 1);
  }
  if (token.empty() || token.find_first_of("+-* ") != absl::string_view::npos) return false;
  int64_t& term = sum->terms[std::string(token)];
  term += sign * coefficient;
  if (term == 0) sum->terms.erase(std::string(token));
  return true;
}

}  // namespace

DimSum DimSum::Parse(absl::string_view param) {
  const std::vector<absl::string_view> tokens = absl::StrSplit(param, ' ', absl::SkipEmpty());
  DimSum sum;
  // token (op token)*: anything else (a name with spaces, "batch*sequence") is one symbol.
  bool parsed = !tokens.empty() && tokens.size() % 2 == 1;
  if (parsed && tokens.size() > 1) {
    int64_t sign = 1;
    absl::string_view first = tokens[0];
    if (first.size() > 1 && first[0] == '-') {
      sign = -1;
      first.remove_prefix(1);
    }
    parsed = AddToken(first, sign, &sum);
    for (size_t i = 1; parsed && i + 1 < tokens.size(); i += 2) {
      parsed = (tokens[i] == "+" || tokens[i] == "-") && AddToken(tokens[i + 1], tokens[i] == "+" ? 1 : -1, &sum);
    }
  } else {
    parsed = false;
  }
  if (parsed) return sum;
  DimSum symbol;
  symbol.terms[std::string(param)] = 1;
  return symbol;
}

DimSum DimSum::Plus(const DimSum& other, int64_t sign) const {
  DimSum sum = *this;
  sum.constant += sign * other.constant;
  for (const auto& [symbol, coefficient] : other.terms) {
    int64_t& term = sum.terms[symbol];
    term += sign * coefficient;
    if (term == 0) sum.terms.erase(symbol);
  }
  return sum;
}

std::string DimSum::Spell() const {
  if (terms.size() == 1 && terms.begin()->second == 1 && constant == 0) return terms.begin()->first;
  std::string spelled;
  auto append = [&spelled](int64_t value, absl::string_view symbol) {
    const int64_t magnitude = value < 0 ? -value : value;
    if (spelled.empty()) {
      if (value < 0) spelled = "-";
    } else {
      absl::StrAppend(&spelled, value < 0 ? " - " : " + ");
    }
    if (symbol.empty()) {
      absl::StrAppend(&spelled, magnitude);
    } else if (magnitude == 1) {
      absl::StrAppend(&spelled, symbol);
    } else {
      absl::StrAppend(&spelled, magnitude, "*", symbol);
    }
  };
  for (const auto& [symbol, coefficient] : terms) append(coefficient, symbol);
  if (constant != 0) append(constant, "");
  return spelled;
}

}  // namespace onnxopt
