# embed_file(VAR FILE): VAR becomes FILE's bytes as a C++ string literal, VAR_SIZE its length.
#
# Every byte becomes a "\xNN" escape, so any content (quotes, backslashes, non-ASCII text) is
# carried exactly; 64 bytes a line keeps the generated file readable by compilers and people.
function(embed_file var file)
  file(READ "${file}" hex HEX)
  string(LENGTH "${hex}" n)
  math(EXPR n "${n} / 2")
  string(REGEX REPLACE "([0-9a-f][0-9a-f])" "\\\\x\\1" escaped "${hex}")
  string(REPEAT "." 256 line)  # 64 escaped bytes
  string(REGEX REPLACE "(${line})" "\\1\"\n    \"" escaped "${escaped}")
  set(${var} "\"${escaped}\"" PARENT_SCOPE)
  set(${var}_SIZE ${n} PARENT_SCOPE)
endfunction()
