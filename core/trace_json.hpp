// Internal to core/trace*.cpp: the pieces of a trace file that a rank file and the merged
// file share. A file is built as text, event by event (one per line), then written whole:
//
//   std::string out;
//   append_process(out, pid, "rank 1: ...", spans);   // "M" events: process and track names
//   append_spans(out, pid, spans, shift_us);          // "X" events, ts + shift_us
//   finish_and_write(path, out, troupe_section);      // closes the JSON, atomic write
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/trace.hpp"

namespace troupe::trace::json_detail {

void append_process(std::string& out, int pid, const std::string& process_name,
                    const std::vector<Span>& spans);
void append_spans(std::string& out, int pid, const std::vector<Span>& spans, int64_t shift_us);
nlohmann::ordered_json info_json(const RankInfo& info);
// Ends the text with "displayTimeUnit" and the "troupe" section, then writes it to path + ".tmp",
// fsyncs and renames it over path (creating the parent directory). Throws troupe::IoError.
void finish_and_write(const std::string& path, std::string& out,
                      const nlohmann::ordered_json& troupe_section);

}  // namespace troupe::trace::json_detail
