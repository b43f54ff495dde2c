#pragma once
// One Report, several readers: a terminal table for people, JSON and CSV for scripts, and an
// HTML page with inline SVG charts and embedded PNG images that opens in any browser with no
// network and no JavaScript.
//
// Infinite values (the SNR of identical tensors, the PSNR of identical images) are written
// as null in JSON, "inf" in CSV and the tables.
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "formats/image/image.h"
#include "convert/report/report.h"

namespace klein::report {

nlohmann::ordered_json report_json(const Report& report);

// The summary, per component and per unit totals, the `worst` worst tensors, the end-to-end
// figures and the policy proposal, as aligned text.
std::string report_table(const Report& report, size_t worst = 15);

std::string tensors_csv(const Report& report);  // one row per tensor, worst first
std::string units_csv(const Report& report);    // one row per unit
std::string e2e_csv(const Report& report);      // one row per compared stage ("" without e2e)

std::string report_html(const Report& report);

// Writes report.json, tensors.csv, units.csv, e2e.csv, report.html, the images of every case
// (caseN-reference.png, caseN-candidate.png, caseN-difference.png) and policy.txt into `dir`
// (created if needed), each file atomically. Returns the files written.
std::vector<std::filesystem::path> write_report(const Report& report,
                                                const std::filesystem::path& dir);

}  // namespace klein::report
