# SPDX-License-Identifier: Apache-2.0
# Stand-in test registered when a model checker is missing at configure time: it fails with the reason.
message(FATAL_ERROR "${MSG}")
