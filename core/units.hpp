// Durations and byte sizes as users write them in job specs and on the command line.
//
//   duration: "250ms", "30s", "1.5s", "2m", "2min", "1h", "1d", "1500us"; a plain number is seconds.
//   size:     "4096", "512MiB", "16GiB", "1.5GB", "64Ki", "2G"; a plain number is bytes.
//             KiB/MiB/GiB/TiB (and Ki/Mi/Gi/Ti) are powers of 1024, kB/MB/GB/TB (and k/K/M/G/T) of 1000.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace troupe {

// Millisecond resolution: values round to the nearest millisecond, and a positive value that would
// round to zero ("100us") is rejected rather than silently becoming "no time at all". Negative,
// non-finite, unit-less garbage or overflowing values give nullopt.
std::optional<std::chrono::milliseconds> parse_duration(std::string_view text);

// Fractional results round to the nearest byte; negative or overflowing values give nullopt.
std::optional<uint64_t> parse_size(std::string_view text);

// Shortest exact spelling, parseable by parse_duration: "0s", "1500ms", "30s", "2m", "1h".
std::string format_duration(std::chrono::milliseconds d);

// Shortest exact spelling, parseable by parse_size: "0", "4097", "512MiB", "16GiB".
std::string format_size(uint64_t bytes);

}  // namespace troupe
