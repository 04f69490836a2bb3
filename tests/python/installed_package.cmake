# ctest driver (python.installed_package): `cmake --install` the build to a scratch prefix and
# import the installed oasis package (not the build tree's) with the module's interpreter.
#   -DBUILD=<build dir> -DWORK=<scratch dir> -DPYTHON=<interpreter> -DSITE=<OASIS_PYTHON_INSTALL_DIR>
set(prefix ${WORK}/prefix)
file(REMOVE_RECURSE ${WORK})
execute_process(COMMAND ${CMAKE_COMMAND} --install ${BUILD} --prefix ${prefix} RESULT_VARIABLE rc OUTPUT_QUIET)
if(rc)
  message(FATAL_ERROR "cmake --install failed: ${rc}")
endif()
set(ENV{PYTHONPATH} ${prefix}/${SITE})
set(ENV{PYTHONDONTWRITEBYTECODE} 1)
execute_process(COMMAND ${PYTHON} -c
  "import numpy as np, oasis, sys; assert oasis.__file__.startswith(sys.argv[1]), oasis.__file__; \
r = oasis.softmax1(np.array([0.0, 0.0])); assert r['p_null'] == 1 / 3, r; print('installed:', oasis.__file__)"
  ${prefix} RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "importing the installed package failed: ${rc}")
endif()
