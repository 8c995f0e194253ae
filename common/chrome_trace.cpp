#include "common/chrome_trace.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

namespace meshwork {

std::string JsonQuote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

namespace {

std::string Number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", v);
  return buf;
}

}  // namespace

ChromeTrace::ChromeTrace(int pid, std::string process_name, double origin_seconds)
    : pid_(pid), process_name_(std::move(process_name)), origin_(origin_seconds) {}

int ChromeTrace::Lane(const std::string& lane) {
  auto it = lanes_.find(lane);
  if (it != lanes_.end()) return it->second;
  const int tid = static_cast<int>(lanes_.size()) + 1;
  lanes_.emplace(lane, tid);
  return tid;
}

void ChromeTrace::Span(const std::string& lane, const std::string& name, double start, double end,
                       const std::map<std::string, std::string>& args) {
  std::ostringstream e;
  e << "{\"ph\":\"X\",\"pid\":" << pid_ << ",\"tid\":" << Lane(lane) << ",\"name\":" << JsonQuote(name)
    << ",\"ts\":" << Number(Micros(start)) << ",\"dur\":" << Number(std::max(0.0, end - start) * 1e6);
  if (!args.empty()) {
    e << ",\"args\":{";
    bool first = true;
    for (const auto& [k, v] : args) {
      e << (first ? "" : ",") << JsonQuote(k) << ":" << JsonQuote(v);
      first = false;
    }
    e << "}";
  }
  e << "}";
  events_.push_back(e.str());
}

void ChromeTrace::Counter(const std::string& track, double at, double value) {
  std::ostringstream e;
  e << "{\"ph\":\"C\",\"pid\":" << pid_ << ",\"name\":" << JsonQuote(track) << ",\"ts\":" << Number(Micros(at))
    << ",\"args\":{\"value\":" << Number(value) << "}}";
  events_.push_back(e.str());
}

std::string ChromeTrace::EventsJson() const {
  std::ostringstream out;
  out << "{\"ph\":\"M\",\"pid\":" << pid_ << ",\"name\":\"process_name\",\"args\":{\"name\":"
      << JsonQuote(process_name_) << "}}";
  for (const auto& [lane, tid] : lanes_) {
    out << ",\n{\"ph\":\"M\",\"pid\":" << pid_ << ",\"tid\":" << tid
        << ",\"name\":\"thread_name\",\"args\":{\"name\":" << JsonQuote(lane) << "}}";
    out << ",\n{\"ph\":\"M\",\"pid\":" << pid_ << ",\"tid\":" << tid
        << ",\"name\":\"thread_sort_index\",\"args\":{\"sort_index\":" << tid << "}}";
  }
  for (const auto& e : events_) out << ",\n" << e;
  return out.str();
}

std::string ChromeTrace::Document(const std::vector<std::string>& ranks_events) {
  std::string out = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  bool first = true;
  for (const auto& events : ranks_events) {
    if (events.empty()) continue;
    if (!first) out += ",\n";
    out += events;
    first = false;
  }
  return out + "\n]}\n";
}

}  // namespace meshwork
