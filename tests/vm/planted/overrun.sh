#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# Planted for tests/vm/runner_test.sh, never part of the suite: runs far past its limit (the
# run's GDIRECT_TEST_TIMEOUT), in a child too. The guest's runner must report a TIMEOUT and
# kill the test's whole process group.
sleep 600 &
sleep 600
