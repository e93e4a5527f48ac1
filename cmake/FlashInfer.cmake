# FlashInfer's header-only paged attention (batch decode and causal batch prefill over paged KV), included
# only when AMOEBA_FLASHINFER is ON.
#
# Where it comes from: the PyPI wheel flashinfer-python==0.7.2.post1 (a pure Python wheel, ~62 MB, Apache-2.0),
# which ships the CUDA headers under flashinfer/data/include/ and the CCCL it was built against under
# flashinfer/data/cccl/. Only those two include trees are unpacked into the build tree; nothing is compiled
# here (the kernels are templates instantiated by amoeba's own translation units).
#
# Why this exact version: 0.7.4 changed PrefillPlan (a new argument) and the prefill dispatch template that
# kernels/attention/paged_attention.cuh calls; the sha256 below pins the very file.
#
# Why the wheel's libcudacxx goes first on the include path: CUDA 13.0's own CCCL (3.0.1) lacks
# cuda::fast_mod_div, which FlashInfer's fastdiv.cuh uses, so <cuda/...> must resolve to the wheel's copy
# before /usr/local/cuda/include. Both trees are -isystem (FlashInfer's headers warn under -Wall).
#
# AMOEBA_FLASHINFER_WHEEL may name a local copy of the same wheel (machines without network); its sha256 is
# checked all the same.
set(AMOEBA_FLASHINFER_VERSION "0.7.2.post1")
set(AMOEBA_FLASHINFER_SHA256 "bfdc18b9e1e4d8d0730fe4343dc0e284cd0c160086de80f99888bc4867922d49")
set(AMOEBA_FLASHINFER_URL
    "https://files.pythonhosted.org/packages/b6/ad/da1fc7644b28ab82db922021955a0c85c8d6b3b1d6db224a13ef65cef85e/flashinfer_python-${AMOEBA_FLASHINFER_VERSION}-py3-none-any.whl")
set(AMOEBA_FLASHINFER_WHEEL "" CACHE FILEPATH "Local flashinfer_python-${AMOEBA_FLASHINFER_VERSION} wheel (else downloaded from PyPI)")

set(_fi_root ${CMAKE_BINARY_DIR}/_deps/flashinfer-${AMOEBA_FLASHINFER_VERSION})
set(_fi_stamp ${_fi_root}/unpacked.stamp)
if(NOT EXISTS ${_fi_stamp})
  set(_fi_wheel ${_fi_root}/flashinfer_python-${AMOEBA_FLASHINFER_VERSION}-py3-none-any.whl)
  if(AMOEBA_FLASHINFER_WHEEL)
    file(SHA256 ${AMOEBA_FLASHINFER_WHEEL} _fi_sha)
    if(NOT _fi_sha STREQUAL AMOEBA_FLASHINFER_SHA256)
      message(FATAL_ERROR "AMOEBA_FLASHINFER_WHEEL = ${AMOEBA_FLASHINFER_WHEEL}: sha256 ${_fi_sha} is not the "
                          "pinned ${AMOEBA_FLASHINFER_SHA256} of flashinfer-python ${AMOEBA_FLASHINFER_VERSION}")
    endif()
    set(_fi_wheel ${AMOEBA_FLASHINFER_WHEEL})
  elseif(NOT EXISTS ${_fi_wheel})
    message(STATUS "amoeba: downloading flashinfer-python ${AMOEBA_FLASHINFER_VERSION} (62 MB) from PyPI")
    file(DOWNLOAD ${AMOEBA_FLASHINFER_URL} ${_fi_wheel}.part EXPECTED_HASH SHA256=${AMOEBA_FLASHINFER_SHA256}
         STATUS _fi_status TLS_VERIFY ON)
    list(GET _fi_status 0 _fi_code)
    if(NOT _fi_code EQUAL 0)
      # No network must not break the rest of the build: say so loudly and build without attention.
      file(REMOVE ${_fi_wheel}.part)
      message(WARNING "amoeba: downloading ${AMOEBA_FLASHINFER_URL} failed (${_fi_status}): paged attention is "
                      "NOT built. Set AMOEBA_FLASHINFER_WHEEL to a local copy of the wheel, or AMOEBA_FLASHINFER=OFF.")
      return()
    endif()
    file(RENAME ${_fi_wheel}.part ${_fi_wheel})
  endif()
  file(REMOVE_RECURSE ${_fi_root}/flashinfer)
  file(ARCHIVE_EXTRACT INPUT ${_fi_wheel} DESTINATION ${_fi_root}
       PATTERNS "flashinfer/data/include/*" "flashinfer/data/cccl/libcudacxx/include/*")
  if(NOT EXISTS ${_fi_root}/flashinfer/data/include/flashinfer/attention/decode.cuh)
    message(FATAL_ERROR "amoeba: ${_fi_wheel} holds no flashinfer/data/include/flashinfer/attention/decode.cuh")
  endif()
  file(WRITE ${_fi_stamp} "${AMOEBA_FLASHINFER_SHA256}\n")
endif()

# flashinfer::headers: the two include trees in the order above, and the definitions FlashInfer's bf16 paths
# need. Flags measured to work with nvcc 13.0 + g++ 12 for sm_90a (shared/GPU_NOTES.md).
add_library(amoeba_flashinfer_headers INTERFACE)
add_library(flashinfer::headers ALIAS amoeba_flashinfer_headers)
target_include_directories(amoeba_flashinfer_headers SYSTEM BEFORE INTERFACE
  ${_fi_root}/flashinfer/data/cccl/libcudacxx/include
  ${_fi_root}/flashinfer/data/include)
target_compile_definitions(amoeba_flashinfer_headers INTERFACE FLASHINFER_ENABLE_BF16 FLASHINFER_ENABLE_F16)
target_compile_options(amoeba_flashinfer_headers INTERFACE
  $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -use_fast_math>)
set(AMOEBA_HAS_FLASHINFER ON)
message(STATUS "amoeba: FlashInfer ${AMOEBA_FLASHINFER_VERSION} headers in ${_fi_root}")
