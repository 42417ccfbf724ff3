// The report as one self-contained HTML page: summary, parity, benchmark and pipeline tables, and
// charts drawn as inline SVG (latency distributions before/after per shape set, node count after
// each pass, op histogram before/after). No external resources; a few lines of inline script only
// record, on <body data-rendered>, how many chart marks the browser laid out with a non-zero size,
// so a headless browser test can tell the charts really render.
#ifndef ONNXOPT_CLIENT_REPORT_HTML_H_
#define ONNXOPT_CLIENT_REPORT_HTML_H_

#include <string>

#include "onnxopt/v1/report.pb.h"

namespace onnxopt::client {

std::string RenderReportHtml(const v1::Report& report);

// Text made safe for HTML element content and attribute values.
std::string HtmlEscape(const std::string& text);

}  // namespace onnxopt::client

#endif  // ONNXOPT_CLIENT_REPORT_HTML_H_
