// SPDX-License-Identifier: Apache-2.0
// Consumer check (.cpp; built with g++ and with clang++): the installed headers and ferry::ferry work
// from another project, both sides on the host backend.
#include "both_sides.hpp"

int main() { return consumer::run_both_sides<ferry::backend::host_backend>("c++ host") == 0 ? 0 : 1; }
