// SPDX-License-Identifier: Apache-2.0
// Umbrella header of the D2H side: ferry::d2h::channel<B> and its vocabulary.
#pragma once

#include <ferry/d2h/channel.hpp>
#include <ferry/d2h/dtype.hpp>
#include <ferry/d2h/entry_view.hpp>
#include <ferry/d2h/errors.hpp>
#include <ferry/d2h/forward_plan.hpp>
#include <ferry/d2h/hook_schema.hpp>
#include <ferry/d2h/ring_ref.hpp>
#include <ferry/d2h/row_selection.hpp>
#include <ferry/d2h/sink.hpp>
#include <ferry/d2h/typed_view.hpp>
#include <ferry/d2h/types.hpp>
#include <ferry/d2h/write_ticket.hpp>
