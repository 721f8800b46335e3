// examples/snapshot_store/commands.hpp: clm_store's commands, one file per
// concept (text_keys.cpp, ingest.cpp, lookup.cpp, maintenance.cpp, rekey.cpp,
// plot.cpp, anomalies.cpp;
// the administration by hand in admin.hpp), each with its --help text; main.cpp
// dispatches to them.
#pragma once

#include <string_view>

#include "cli.hpp"

namespace clm_store_cli {

extern const std::string_view kKeyUsage;
extern const std::string_view kIngestUsage;
extern const std::string_view kLookupUsage;
extern const std::string_view kStatsUsage;
extern const std::string_view kEvictUsage;
extern const std::string_view kRebuildUsage;
extern const std::string_view kCheckUsage;
extern const std::string_view kRekeyUsage;
extern const std::string_view kPlotUsage;
extern const std::string_view kAnomaliesUsage;

int cmd_key(const Args& args);
int cmd_ingest(const Args& args);
int cmd_lookup(const Args& args);
int cmd_stats(const Args& args);
int cmd_evict(const Args& args);
int cmd_rebuild(const Args& args);
int cmd_check(const Args& args);
int cmd_rekey(const Args& args);
int cmd_plot(const Args& args);
int cmd_anomalies(const Args& args);

}  // namespace clm_store_cli
