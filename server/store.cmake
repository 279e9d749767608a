# Parameter storage and update rules (server library part).
add_library(ps_store optimizer.cc table.cc)
target_link_libraries(ps_store PUBLIC ps_common)

ps_add_test(store_test SOURCES optimizer_test.cc table_test.cc LIBS ps_store)

# Micro-benchmark of Table::Push/Pull (not a test): ./server/store_bench
add_executable(store_bench store_bench.cc)
target_link_libraries(store_bench PRIVATE ps_store)
