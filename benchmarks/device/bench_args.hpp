// Command-line lists of the device benchmarks (paged_moe_bench, dense_gemm_bench): "a,b,c" split at commas
// (empty items dropped), and lists of integers.
#pragma once

#include <sstream>
#include <string>
#include <vector>

namespace amoeba::bench {

inline std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> v;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) v.push_back(item);
  return v;
}

inline std::vector<int> parse_ints(const std::string& s) {
  std::vector<int> v;
  for (const std::string& item : split(s)) v.push_back(std::stoi(item));
  return v;
}

}  // namespace amoeba::bench
