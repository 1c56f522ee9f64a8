// Sets one field of a checkpoint manifest and signs the result again (its
// last line, the checksum of everything before it), as a user who edits a
// manifest by hand and fixes its checksum would: the fault suite's way to
// give gpt_train a manifest whose fields are well-formed text but bad values.
//
//   manifest_edit <manifest> <line prefix> <new line>
//   e.g. manifest_edit step_00000002/manifest "meta seq " "meta seq 1e20"
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>

#include "summa/io/checkpoint.hpp"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: manifest_edit <manifest> <line prefix> <new line>\n");
    return 2;
  }
  std::string text;
  {
    std::ifstream in(argv[1], std::ios::binary);
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  const std::string prefix = argv[2];
  std::string out;
  bool found = false;
  std::size_t at = 0;
  while (at < text.size()) {
    const std::size_t end = text.find('\n', at);
    const std::string line = text.substr(at, end - at);
    at = end == std::string::npos ? text.size() : end + 1;
    if (line.rfind("checksum ", 0) == 0) continue;
    if (!found && line.rfind(prefix, 0) == 0) {
      out += std::string(argv[3]) + "\n";
      found = true;
    } else {
      out += line + "\n";
    }
  }
  if (!found) {
    std::fprintf(stderr, "manifest_edit: no line starts with '%s'\n", argv[2]);
    return 1;
  }
  char sum[32];
  std::snprintf(sum, sizeof sum, "%016llx",
                static_cast<unsigned long long>(summa::checksum64(out.data(), out.size())));
  out += "checksum " + std::string(sum) + "\n";
  std::ofstream(argv[1], std::ios::binary | std::ios::trunc) << out;
  return 0;
}
