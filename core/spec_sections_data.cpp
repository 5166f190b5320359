// The data section: where the tokens come from (synthetic, text, token files), the keys only
// token data reads, and the validation split.
#include <string>

#include "core/spec_sections.hpp"

namespace troupe::spec_detail {

namespace {

// Whether `k`, a key of token data, is to be read: yes for data.source tokens; for another source
// a written key is refused at its position, so that a stray key is noticed.
bool tokens_key(S& s, K& k, const JobSpec& j) {
  if (!s.ctx().ok("data.source")) return false;
  if (j.data.source == DataSource::tokens) return true;
  if (s.has(k))
    s.refuse(k, "'data." + k + "' applies only to data.source tokens",
             "delete it, or set data.source: tokens (token files; see docs/training.md#token-data)");
  return false;
}

void data_rules(Section& s, JobSpec& j) {
  Ctx& ctx = s.ctx();
  DataSpec& d = j.data;
  if (!ctx.ok("data") || !ctx.ok("data.source")) return;
  const int vocab = j.model.vocab_size;
  if (d.source != DataSource::tokens && ctx.ok("model.vocab_size") && vocab != 256)
    ctx.error(ctx.loc("model.vocab_size"),
              "model.vocab_size is " + std::to_string(vocab) + " but data.source " + to_string(d.source) +
                  " is bytes: byte-level text has 256 ids",
              "set model.vocab_size: 256 or use data.source: tokens");
  if (d.source != DataSource::tokens) return;
  if (d.eot >= 0 && ctx.ok("data.eot") && ctx.ok("model.vocab_size") && d.eot >= vocab)
    ctx.error(ctx.loc("data.eot"),
              "data.eot (" + std::to_string(d.eot) + ") is not below model.vocab_size (" +
                  std::to_string(vocab) + ")",
              "the end-of-text id is a token id, in [0, model.vocab_size); troupe's tokenizer uses 256");
  if (!d.val_path.empty() && ctx.ok("data.val_path")) {
    // The split is val_path's files; the tail of the training tokens is not held out.
    if (ctx.present("data.val_fraction") && ctx.ok("data.val_fraction") && d.val_fraction != 0) {
      ctx.error(ctx.loc("data.val_fraction"),
                "data.val_path and data.val_fraction (" + fmt_real(d.val_fraction) +
                    ") both choose the validation split",
                "delete val_fraction (the files of val_path are the validation split), or delete val_path "
                "to hold out the last val_fraction of the training tokens");
      ctx.mark_bad("data.val_fraction");
    } else {
      d.val_fraction = 0;
    }
  }
}

}  // namespace

const Table& data_table() {
  static const Table t{
      {
          {"source", [](S& s, K& k, JobSpec& j) { s.enumeration(k, j.data.source); }},
          {"path",
           [](S& s, K& k, JobSpec& j) {
             Ctx& ctx = s.ctx();
             if (!ctx.ok("data") || !ctx.ok("data.source")) return;
             if (j.data.source != DataSource::synthetic) {
               if (ctx.present("data")) s.string(k, j.data.path, true, false);
             } else if (s.has(k)) {
               s.refuse(k, "'data.path' is read only when data.source is text or tokens",
                        "delete it, or set data.source: text");
             }
           }},
          {"val_fraction",
           [](S& s, K& k, JobSpec& j) {
             s.real(k, j.data.val_fraction, 0.0, true, 1.0, false,
                    "the share of the data held out for evaluation, in [0, 1); e.g. 0.05");
           }},
          {"dtype",
           [](S& s, K& k, JobSpec& j) {
             if (!tokens_key(s, k, j) || !s.has(k)) return;
             TokenDType v = TokenDType::uint16;
             s.enumeration(k, v);
             if (s.ctx().ok("data.dtype")) j.data.dtype = v;
           }},
          {"val_path",
           [](S& s, K& k, JobSpec& j) {
             if (tokens_key(s, k, j)) s.string(k, j.data.val_path);
           }},
          {"eot",
           [](S& s, K& k, JobSpec& j) {
             if (tokens_key(s, k, j))
               s.integer(k, j.data.eot, 0, (1 << 24) - 1, false,
                         "the end-of-text token id, in [0, model.vocab_size); troupe's tokenizer uses 256");
           }},
          {"tokenizer",
           [](S& s, K& k, JobSpec& j) {
             if (tokens_key(s, k, j)) s.string(k, j.data.tokenizer);
           }},
      },
      data_rules};
  return t;
}

}  // namespace troupe::spec_detail
