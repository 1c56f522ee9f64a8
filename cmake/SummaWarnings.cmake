# Warnings are errors on every target the project builds (never on consumers).
function(summa_set_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Werror)
endfunction()
