// A Chrome trace (the JSON "Trace Event Format" that Perfetto and chrome://tracing read) of
// one training step: named lanes (threads) of complete events, and counter tracks. One
// ChromeTrace per rank (its pid); Document() joins several ranks' events into one file.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace meshwork {

class ChromeTrace {
 public:
  // `origin_seconds`: the steady-clock time that is 0 in the trace (the step's start).
  ChromeTrace(int pid, std::string process_name, double origin_seconds);

  // A complete ("X") event on `lane` from `start` to `end` (steady-clock seconds). `args` are
  // shown in the event's details.
  void Span(const std::string& lane, const std::string& name, double start, double end,
            const std::map<std::string, std::string>& args = {});
  // A counter ("C") sample: `track` has `value` from time `at` on.
  void Counter(const std::string& track, double at, double value);

  int events() const { return static_cast<int>(events_.size()); }
  // This rank's events as a JSON array's elements (no brackets), lane names included.
  std::string EventsJson() const;
  // A whole trace file from one or more ranks' EventsJson().
  static std::string Document(const std::vector<std::string>& ranks_events);

 private:
  int Lane(const std::string& lane);
  double Micros(double t) const { return (t - origin_) * 1e6; }

  int pid_;
  std::string process_name_;
  double origin_;
  std::map<std::string, int> lanes_;  // name -> tid, in order of first use
  std::vector<std::string> events_;
};

// JSON string literal of `s` (quotes included), escaping what JSON requires.
std::string JsonQuote(const std::string& s);

}  // namespace meshwork
