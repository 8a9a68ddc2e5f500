# Compile options shared by every kvpush target: kvpush_options (an INTERFACE target).
add_library(kvpush_options INTERFACE)
target_compile_options(kvpush_options INTERFACE -Wall -Wextra -Wpedantic -Wshadow
                                                -Wnon-virtual-dtor -Wno-missing-field-initializers)
if(KVPUSH_WERROR)
  target_compile_options(kvpush_options INTERFACE -Werror)
endif()
target_include_directories(kvpush_options INTERFACE ${PROJECT_SOURCE_DIR}/src)
if(KVPUSH_SANITIZE)
  target_compile_options(kvpush_options INTERFACE -fsanitize=${KVPUSH_SANITIZE} -fno-omit-frame-pointer
                                                  -fno-sanitize-recover=all)
  target_link_options(kvpush_options INTERFACE -fsanitize=${KVPUSH_SANITIZE})
endif()

# kvpush_add_library(NAME SOURCES... [DEPS ...]): one static library per layer.
function(kvpush_add_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  add_library(${name} STATIC ${ARG_SOURCES})
  target_link_libraries(${name} PUBLIC kvpush_options ${ARG_DEPS})
endfunction()
