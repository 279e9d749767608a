# Data readers (LIBSVM, Criteo TSV, synthetic) and evaluation metrics.
add_library(ps_data libsvm.cc shuffle.cc synthetic.cc metrics.cc)
target_include_directories(ps_data PUBLIC ${CMAKE_SOURCE_DIR})
target_link_libraries(ps_data PUBLIC ps_common
  absl::status absl::statusor absl::strings absl::span)

ps_add_test(data_test SOURCES data_test.cc metrics_test.cc LIBS ps_data)
# Tests read the shared data sets from ../shared/data next to the project
# root; they skip with a message when a file is missing.
target_compile_definitions(data_test PRIVATE
  PS_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
