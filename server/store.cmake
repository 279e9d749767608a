# Parameter storage and update rules (server library part).
find_package(ZLIB REQUIRED)  # crc32 of checkpoint files (gRPC links it too)
add_library(ps_store optimizer.cc table.cc checkpoint.cc key_slot_map.cc)
# The update rules' loops (inlined into table.cc) vectorise only at -O3 with
# GCC 12; per-element arithmetic is unchanged (no FMA contraction without
# -march), so servers still agree bit for bit.
# -fno-math-errno: nothing reads errno after sqrt, and without it every
# sqrt carries a test and a call for negative inputs. -ffp-contract=off: the
# FTRL lanes' clones for CPUs with FMA (table.cc) compute the same bits as
# the scalar code.
set_source_files_properties(table.cc PROPERTIES COMPILE_OPTIONS
  "-fno-math-errno;-fno-trapping-math;-ffp-contract=off;$<$<CONFIG:Release,RelWithDebInfo>:-O3>")
target_link_libraries(ps_store PUBLIC ps_common PRIVATE ZLIB::ZLIB)

ps_add_test(store_test SOURCES optimizer_test.cc table_test.cc key_slot_map_test.cc
  LIBS ps_store)
ps_add_test(checkpoint_test SOURCES checkpoint_test.cc LIBS ps_store)

# Micro-benchmark of Table::Push/Pull (not a test): ./server/store_bench
add_executable(store_bench store_bench.cc)
target_link_libraries(store_bench PRIVATE ps_store)
