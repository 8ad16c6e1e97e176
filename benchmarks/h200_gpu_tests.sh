#!/usr/bin/env bash
# The GPU test suite on the H200 (after installing the TE kit); full log in /tmp/res/gpu-tests.log.
mkdir -p /tmp/res
timeout 140 python3 -m pytest tests/test_train_gpu.py tests/test_convert_gpu.py -q -rfEs --tb=short -p no:cacheprovider \
  > /tmp/res/gpu-tests.log 2>&1
grep -E "^(FAILED|ERROR|SKIPPED)|passed|failed" /tmp/res/gpu-tests.log
