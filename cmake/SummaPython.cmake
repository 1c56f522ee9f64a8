# One Python for everything the project runs in Python: scaling_study --plot,
# gpt_train's plot hint, the scripts (they read SUMMA_PYTHON from the build's
# CMakeCache.txt: scripts/python.sh), and the CTest entries.
#
#   SUMMA_PYTHON            the interpreter (a cache path; give it to override)
#   SUMMA_PYTHON_REQUIRE    modules that must import, e.g. "matplotlib"
#                           (scripts/quickstart.sh sets what it installed): the
#                           configure fails naming the interpreter otherwise
#   SUMMA_PYTHON_MATPLOTLIB / SUMMA_PYTHON_TORCH   1 when the module imports
#
# Without SUMMA_PYTHON the candidates are Debian's /usr/bin/python3 (where the
# project's Debian packages install python3-matplotlib and python3-torch) and
# then the python3 that FindPython3 finds on PATH (a pyenv or conda shim); the
# first that imports matplotlib wins, else the first that runs.
include_guard(GLOBAL)

set(SUMMA_PYTHON_REQUIRE "" CACHE STRING "Python modules the configure requires (;-list)")

function(_summa_python_imports python module out)
  execute_process(COMMAND "${python}" -c "import ${module}" RESULT_VARIABLE rc OUTPUT_QUIET
                  ERROR_QUIET TIMEOUT 120)
  if(rc EQUAL 0)
    set(${out} 1 PARENT_SCOPE)
  else()
    set(${out} 0 PARENT_SCOPE)
  endif()
endfunction()

# An interpreter this module chose itself is chosen again at every configure
# (matplotlib may have been installed since); one given by the user is kept.
if(SUMMA_PYTHON AND SUMMA_PYTHON STREQUAL _SUMMA_PYTHON_AUTO)
  unset(SUMMA_PYTHON CACHE)
endif()
if(NOT SUMMA_PYTHON)
  set(_candidates "")
  if(EXISTS /usr/bin/python3)
    list(APPEND _candidates /usr/bin/python3)
  endif()
  find_package(Python3 QUIET COMPONENTS Interpreter)
  if(Python3_EXECUTABLE)
    list(APPEND _candidates "${Python3_EXECUTABLE}")
  endif()
  set(_chosen "")
  foreach(_python IN LISTS _candidates)
    _summa_python_imports("${_python}" matplotlib _has)
    if(_has)
      set(_chosen "${_python}")
      break()
    endif()
  endforeach()
  if(NOT _chosen AND _candidates)
    list(GET _candidates 0 _chosen)
  endif()
  set(SUMMA_PYTHON "${_chosen}" CACHE FILEPATH "The Python interpreter of plots, scripts and tests"
      FORCE)
  set(_SUMMA_PYTHON_AUTO "${_chosen}" CACHE INTERNAL "")
endif()

set(SUMMA_PYTHON_MATPLOTLIB 0)
set(SUMMA_PYTHON_TORCH 0)
if(SUMMA_PYTHON)
  _summa_python_imports("${SUMMA_PYTHON}" matplotlib SUMMA_PYTHON_MATPLOTLIB)
  _summa_python_imports("${SUMMA_PYTHON}" torch SUMMA_PYTHON_TORCH)
endif()
foreach(_module IN LISTS SUMMA_PYTHON_REQUIRE)
  if(NOT SUMMA_PYTHON)
    message(FATAL_ERROR "SUMMA_PYTHON_REQUIRE=${SUMMA_PYTHON_REQUIRE}: no Python 3 interpreter "
                        "found (install python3, or give -DSUMMA_PYTHON=/path/to/python3)")
  endif()
  _summa_python_imports("${SUMMA_PYTHON}" ${_module} _has)
  if(NOT _has)
    message(FATAL_ERROR "SUMMA_PYTHON_REQUIRE=${SUMMA_PYTHON_REQUIRE}: ${SUMMA_PYTHON} cannot "
                        "import ${_module} (Debian: python3-${_module}; or give "
                        "-DSUMMA_PYTHON=/path/to/a/python3 that has it)")
  endif()
endforeach()
message(STATUS "summa: Python ${SUMMA_PYTHON} (matplotlib ${SUMMA_PYTHON_MATPLOTLIB}, "
               "torch ${SUMMA_PYTHON_TORCH})")
