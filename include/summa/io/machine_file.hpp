#pragma once
/// \file machine_file.hpp
/// Machine files (JSON; schema "summa-machine/1", docs/scaling.md): read,
/// checked and written. Shipped files live in machines/ of the repository
/// and are installed with the package (share/summa/machines/).

#include <string>
#include <string_view>

#include "summa/model/machine.hpp"

namespace summa::io {

/// Parses a machine file's text; `what` names it in errors. Throws
/// summa::Error naming the key and the value at fault (unknown or missing
/// keys, non-positive rates, unknown algorithms or element types).
model::Machine parse_machine(std::string_view text, std::string_view what);
/// Reads and parses the file at `path`.
model::Machine load_machine(const std::string& path);
/// The machine as JSON text (pretty-printed, keys in schema order);
/// parse_machine(machine_json(m)) == m up to the printed precision (17
/// significant digits: exact for doubles).
std::string machine_json(const model::Machine& machine);
/// Writes machine_json atomically (io::write_file_atomic).
void save_machine(const std::string& path, const model::Machine& machine);

}  // namespace summa::io
