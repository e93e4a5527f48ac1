# Fuzz target for the reference engine's parsers (trace lines, scenario configs, model/GPU/cost-model files).
if(TARGET amoeba_engine)
  amoeba_add_fuzz_target(parsers_fuzz ${CMAKE_CURRENT_LIST_DIR}/parsers_fuzz.cpp)
  target_link_libraries(parsers_fuzz PRIVATE amoeba_engine)
endif()
