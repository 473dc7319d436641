#pragma once
// The web pages arlo serves and writes, embedded at build time (web/embed.cmake) from web/page/ and
// the uPlot version pinned in web/package-lock.json: no network needed to view them.
#include <string_view>

namespace arlo::web {

// The live run page the status port serves at "/": one HTML document with uPlot, its style and the
// page's script inlined. It polls /api/records and /api/status of the server that served it.
std::string_view run_page();

// The run report (`arlo report`): one HTML document like run_page() that reads its runs from the
// JSON inlined in place of the marker kReportDataMarker (see web/report.h).
std::string_view report_page();

inline constexpr std::string_view kReportDataMarker = "@ARLO_REPORT_DATA@";

}  // namespace arlo::web
