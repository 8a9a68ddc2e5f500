// Seeds for the fuzz targets of what a peer or client sends over the network (pd_message_fuzz,
// xfer_metadata_fuzz, notification_frame_fuzz, handshake_fuzz, transfer_status_fuzz,
// kv_transfer_params_fuzz, sse_fuzz, prompt_list_fuzz): a few valid inputs of each, built with the
// real encoders where there is one.
#pragma once

#include <filesystem>

/// Writes <out>/<target>/*.bin for each target above. Returns false (after printing why) when a
/// seed cannot be built or written.
bool WritePeerSeeds(const std::filesystem::path& out);
