# Finds what the Python package needs, for the top-level CMakeLists.txt to decide whether to
# build it. Sets KVARN_PYTHON_DEPS_FOUND (ON/OFF) and KVARN_PYTHON_WHY_NOT (why not, for the
# STATUS message). Debian: pybind11-dev python3-dev python3-numpy python3-pytest
# (deploy/setup.sh installs them).
#
# Sanitized and fuzzing builds leave it out under AUTO: an instrumented extension module needs
# its sanitizer runtime loaded first, which a stock python3 does not do.
#
# The interpreter: the one the build tests with must have numpy, and the extension must be
# built for it. A python3 earlier on PATH (a pyenv or virtualenv shim) may lack the numpy that
# Debian installed for /usr/bin/python3, so without an explicit -DPython3_EXECUTABLE the first
# of `python3` on PATH and /usr/bin/python3 that imports numpy is used.
if(NOT Python3_EXECUTABLE)
  find_program(KVARN_PATH_PYTHON3 NAMES python3 NO_CACHE)
  foreach(candidate ${KVARN_PATH_PYTHON3} /usr/bin/python3)
    if(EXISTS "${candidate}")
      execute_process(COMMAND "${candidate}" -c "import numpy" RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
      if(rc EQUAL 0)
        set(Python3_EXECUTABLE "${candidate}" CACHE FILEPATH "Python 3 interpreter of the kvarn package")
        break()
      endif()
    endif()
  endforeach()
endif()
find_package(Python3 3.8 COMPONENTS Interpreter Development.Module QUIET)
find_package(pybind11 2.6 CONFIG QUIET)

set(KVARN_PYTHON_DEPS_MISSING "")
if(NOT Python3_Interpreter_FOUND)
  list(APPEND KVARN_PYTHON_DEPS_MISSING "a Python 3 interpreter")
elseif(NOT Python3_Development.Module_FOUND)
  list(APPEND KVARN_PYTHON_DEPS_MISSING "Python ${Python3_VERSION} headers (python3-dev)")
endif()
if(NOT pybind11_FOUND)
  list(APPEND KVARN_PYTHON_DEPS_MISSING "pybind11 (pybind11-dev)")
endif()
if(Python3_Interpreter_FOUND)
  execute_process(COMMAND "${Python3_EXECUTABLE}" -c "import numpy" RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
  if(NOT rc EQUAL 0)
    list(APPEND KVARN_PYTHON_DEPS_MISSING "numpy for ${Python3_EXECUTABLE} (python3-numpy)")
  endif()
endif()
if(KVARN_PYTHON_DEPS_MISSING)
  set(KVARN_PYTHON_DEPS_FOUND OFF)
  list(JOIN KVARN_PYTHON_DEPS_MISSING ", " KVARN_PYTHON_WHY_NOT)
  string(APPEND KVARN_PYTHON_WHY_NOT " not found")
elseif(KVARN_SANITIZER_FLAGS OR KVARN_FUZZ)
  set(KVARN_PYTHON_DEPS_FOUND OFF)
  set(KVARN_PYTHON_WHY_NOT "a sanitized or fuzzing build (python3 does not load the sanitizer runtime; -DKVARN_BUILD_PYTHON=ON builds it anyway)")
else()
  set(KVARN_PYTHON_DEPS_FOUND ON)
  set(KVARN_PYTHON_WHY_NOT "")
endif()
