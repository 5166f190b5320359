// What the tables of the spec's sections share (core/spec_sections*.cpp: the root table and
// the small sections in spec_sections.cpp, model, data, train and parallel in a file each).
// Internal to the spec reader.
#pragma once

#include <cstdint>
#include <limits>
#include <string>

#include "core/spec_internal.hpp"

namespace troupe::spec_detail {

constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();

// Each reader in a table has this shape: `s` is the section, `k` the key the table declares for it.
using S = Section;
using K = const std::string;

// Divisors of n nearest to `near`, to suggest a value that satisfies a divisibility rule.
std::string nearby_divisors(int64_t n, int64_t near, int64_t min = 1);

bool is_gpt(Ctx& ctx, const ModelSpec& m);
bool is_llama(Ctx& ctx, const ModelSpec& m);
// Models with attention heads: gpt and llama.
bool has_heads(Ctx& ctx, const ModelSpec& m);

// The sections' tables, each with its rules.
const Table& model_table();     // spec_sections_model.cpp, with model.rope_scaling
const Table& data_table();      // spec_sections_data.cpp
const Table& train_table();     // spec_sections_train.cpp, with train.optimizer and train.trace
const Table& parallel_table();  // spec_sections_parallel.cpp

}  // namespace troupe::spec_detail
