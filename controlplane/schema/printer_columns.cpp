// meta.k8s.io/v1 Tables for `kubectl get`, built as kube-apiserver builds them: the CRD table
// convertor for custom resources and the built-in printers' columns for the core kinds.
#include "controlplane/schema/printer_columns.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <stdexcept>

#include "controlplane/schema/go_format.h"

namespace meshwork::controlplane::schema {
namespace {

using nlohmann::json;
using Clock = std::chrono::system_clock;

constexpr const char* kNameDescription =
    "Name must be unique within a namespace; see "
    "https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names";
constexpr const char* kAgeDescription =
    "CreationTimestamp is the server time when this object was created (RFC3339, UTC).";

json Column(const std::string& name, const std::string& type, const std::string& format,
            const std::string& description, int priority = 0) {
  return {{"name", name}, {"type", type}, {"format", format}, {"description", description},
          {"priority", priority}};
}

const json& Field(const json& obj, std::initializer_list<const char*> path) {
  static const json kNull;
  const json* cur = &obj;
  for (const char* p : path) {
    if (!cur->is_object()) return kNull;
    auto it = cur->find(p);
    if (it == cur->end()) return kNull;
    cur = &*it;
  }
  return *cur;
}

// A number from an object as int64, without overflowing on 1e300 or a uint64 above INT64_MAX.
int64_t IntOf(const json& v, int64_t fallback = 0) {
  if (v.is_number_integer() && !v.is_number_unsigned()) return v.get<int64_t>();
  if (v.is_number_unsigned()) return static_cast<int64_t>(std::min<uint64_t>(v.get<uint64_t>(), INT64_MAX));
  if (v.is_number_float()) {
    const double d = v.get<double>();
    return d > -9.2e18 && d < 9.2e18 ? static_cast<int64_t>(d) : fallback;
  }
  return fallback;
}

std::string Str(const json& v, const std::string& fallback = "") {
  return v.is_string() ? v.get<std::string>() : fallback;
}

// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's days_from_civil).
int64_t DaysFromCivil(int64_t y, unsigned m, unsigned d) {
  y -= m <= 2;
  const int64_t era = (y >= 0 ? y : y - 399) / 400;
  const unsigned yoe = static_cast<unsigned>(y - era * 400);
  const unsigned doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
  const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + static_cast<int64_t>(doe) - 719468;
}

// RFC 3339 as metav1.Time carries it ("2024-05-01T10:00:00Z", fractions and offsets allowed).
bool ParseTime(const std::string& s, Clock::time_point* out) {
  int y, mo, d, h, mi, sec;
  if (s.size() < 20 || std::sscanf(s.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d", &y, &mo, &d, &h, &mi, &sec) != 6)
    return false;
  if (mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || sec > 60) return false;
  // Keep differences between two parsed times inside a nanosecond int64 (about 292 years).
  if (y < 1900 || y > 2200) return false;
  size_t i = 19;
  int64_t nanos = 0;
  if (s[i] == '.') {
    ++i;
    int digits = 0;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') {
      if (digits < 9) nanos = nanos * 10 + (s[i] - '0'), ++digits;
      ++i;
    }
    while (digits < 9) nanos *= 10, ++digits;
  }
  int64_t offset = 0;
  if (i < s.size() && (s[i] == 'Z' || s[i] == 'z') && i + 1 == s.size()) {
  } else if (i + 6 == s.size() && (s[i] == '+' || s[i] == '-') && s[i + 3] == ':') {
    int oh = std::atoi(s.substr(i + 1, 2).c_str()), om = std::atoi(s.substr(i + 4, 2).c_str());
    offset = (s[i] == '+' ? 1 : -1) * (oh * 3600 + om * 60);
  } else {
    return false;
  }
  int64_t secs = DaysFromCivil(y, static_cast<unsigned>(mo), static_cast<unsigned>(d)) * 86400 +
                 h * 3600 + mi * 60 + sec - offset;
  *out = Clock::time_point(std::chrono::duration_cast<Clock::duration>(
      std::chrono::seconds(secs) + std::chrono::nanoseconds(nanos)));
  return true;
}

// metatable.ConvertToHumanReadableDateType: "<unknown>" for a zero time, else the age.
json AgeCell(const json& timestamp, Clock::time_point now) {
  if (!timestamp.is_string() || timestamp.get<std::string>().empty() ||
      timestamp.get<std::string>().rfind("0001-01-01T00:00:00", 0) == 0)  // Go's zero time
    return "<unknown>";
  Clock::time_point t;
  if (!ParseTime(timestamp.get<std::string>(), &t)) return "<invalid>";
  return HumanDuration(now - t);
}

json RowObject(const json& obj, const std::string& include_object) {
  if (include_object == "Object") return obj;
  json meta = obj.is_object() && obj.contains("metadata") ? obj["metadata"] : json::object();
  return {{"kind", "PartialObjectMetadata"}, {"apiVersion", "meta.k8s.io/v1"}, {"metadata", meta}};
}

json Row(json cells, const json& obj, const std::string& include_object) {
  json row = {{"cells", std::move(cells)}};
  if (include_object != "None") row["object"] = RowObject(obj, include_object);
  return row;
}

json Table(json columns, json rows) {
  return {{"kind", "Table"}, {"apiVersion", "meta.k8s.io/v1"}, {"metadata", json::object()},
          {"columnDefinitions", std::move(columns)}, {"rows", std::move(rows)}};
}

// tableconvertor's cellForJSONValue, plus "string" printing of a non-string value.
json Cell(const PrinterColumn& col, const json& value, Clock::time_point now) {
  if (value.is_null()) return nullptr;
  if (col.type == "integer") {
    if (value.is_number_integer()) return value;
    if (value.is_number_float()) {
      const double d = value.get<double>();
      if (!(d > -9.2e18 && d < 9.2e18)) return nullptr;
      return static_cast<int64_t>(d);
    }
    return nullptr;
  }
  if (col.type == "number") return value.is_number() ? json(value.get<double>()) : json(nullptr);
  if (col.type == "boolean") return value.is_boolean() ? value : json(nullptr);
  if (col.type == "date") {
    if (!value.is_string()) return nullptr;
    return AgeCell(value, now);
  }
  // "string" (and anything else): the value as jsonpath prints it.
  if (value.is_string()) return value;
  return value.dump();
}

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

std::string CreatedAt(const json& obj) {
  Clock::time_point t;
  const json& ts = Field(obj, {"metadata", "creationTimestamp"});
  if (!ts.is_string() || !ParseTime(ts.get<std::string>(), &t)) return "";
  std::time_t tt = Clock::to_time_t(t);
  std::tm tm{};
  gmtime_r(&tt, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// printPod's STATUS and RESTARTS logic (kubernetes/pkg/printers/internalversion).
json PodCells(const json& pod, Clock::time_point now) {
  const json& spec = Field(pod, {"spec"});
  const json& status = Field(pod, {"status"});
  const json& containers = Field(spec, {"containers"});
  const size_t total = containers.is_array() ? containers.size() : 0;
  std::string reason = Str(Field(status, {"phase"}));
  if (!Str(Field(status, {"reason"})).empty()) reason = Str(Field(status, {"reason"}));

  int64_t restarts = 0;
  size_t ready = 0;
  Clock::time_point last_restart{};
  bool has_last_restart = false;
  auto note_restart = [&](const json& cs) {
    const json& fin = Field(cs, {"lastState", "terminated", "finishedAt"});
    Clock::time_point t;
    if (fin.is_string() && ParseTime(fin.get<std::string>(), &t) && (!has_last_restart || t > last_restart)) {
      last_restart = t;
      has_last_restart = true;
    }
  };
  auto term_reason = [](const json& term) {
    if (!Str(Field(term, {"reason"})).empty()) return Str(Field(term, {"reason"}));
    const json& sig = Field(term, {"signal"});
    if (IntOf(sig) != 0) return "Signal:" + std::to_string(IntOf(sig));
    const json& code = Field(term, {"exitCode"});
    return "ExitCode:" + std::to_string(IntOf(code));
  };

  bool initializing = false;
  const json& init_statuses = Field(status, {"initContainerStatuses"});
  const json& init_specs = Field(spec, {"initContainers"});
  if (init_statuses.is_array()) {
    for (size_t i = 0; i < init_statuses.size(); ++i) {
      const json& cs = init_statuses[i];
      restarts += std::clamp<int64_t>(IntOf(Field(cs, {"restartCount"})), 0, 1 << 30);
      note_restart(cs);
      const json& term = Field(cs, {"state", "terminated"});
      const json& waiting = Field(cs, {"state", "waiting"});
      if (term.is_object() && Field(term, {"exitCode"}) == 0) continue;
      if (term.is_object()) {
        reason = "Init:" + term_reason(term);
      } else if (waiting.is_object() && !Str(Field(waiting, {"reason"})).empty() &&
                 Str(Field(waiting, {"reason"})) != "PodInitializing") {
        reason = "Init:" + Str(Field(waiting, {"reason"}));
      } else {
        reason = "Init:" + std::to_string(i) + "/" +
                 std::to_string(init_specs.is_array() ? init_specs.size() : init_statuses.size());
      }
      initializing = true;
      break;
    }
  }
  if (!initializing) {
    restarts = 0;
    has_last_restart = false;
    bool has_running = false;
    const json& statuses = Field(status, {"containerStatuses"});
    if (statuses.is_array()) {
      for (size_t k = statuses.size(); k-- > 0;) {
        const json& cs = statuses[k];
        restarts += std::clamp<int64_t>(IntOf(Field(cs, {"restartCount"})), 0, 1 << 30);
        note_restart(cs);
        const json& waiting = Field(cs, {"state", "waiting"});
        const json& term = Field(cs, {"state", "terminated"});
        if (waiting.is_object() && !Str(Field(waiting, {"reason"})).empty()) {
          reason = Str(Field(waiting, {"reason"}));
        } else if (term.is_object()) {
          reason = term_reason(term);
        } else if (Field(cs, {"state", "running"}).is_object() && Field(cs, {"ready"}) == true) {
          has_running = true;
          ++ready;
        }
      }
    }
    if (reason == "Completed" && has_running) reason = "Running";
  }
  if (Field(pod, {"metadata", "deletionTimestamp"}).is_string()) {
    reason = Str(Field(status, {"reason"})) == "NodeLost" ? "Unknown" : "Terminating";
  }
  std::string restart_cell = std::to_string(restarts);
  if (has_last_restart) restart_cell += " (" + HumanDuration(now - last_restart) + " ago)";
  return json::array({Str(Field(pod, {"metadata", "name"})),
                      std::to_string(ready) + "/" + std::to_string(total), reason, restart_cell,
                      AgeCell(Field(pod, {"metadata", "creationTimestamp"}), now),
                      Str(Field(status, {"podIP"}), "<none>"), Str(Field(spec, {"nodeName"}), "<none>"),
                      Str(Field(status, {"nominatedNodeName"}), "<none>"), "<none>"});
}

std::string ServicePorts(const json& svc) {
  const json& ports = Field(svc, {"spec", "ports"});
  if (!ports.is_array() || ports.empty()) return "<none>";
  std::string out;
  for (const auto& p : ports) {
    if (!out.empty()) out += ",";
    const json& port = Field(p, {"port"});
    const json& node_port = Field(p, {"nodePort"});
    out += port.is_number() ? std::to_string(IntOf(port)) : "";
    if (IntOf(node_port) != 0) out += ":" + std::to_string(IntOf(node_port));
    out += "/" + Str(Field(p, {"protocol"}), "TCP");
  }
  return out;
}

std::string JoinStrings(const json& arr) {
  std::string out;
  if (!arr.is_array()) return out;
  for (const auto& v : arr) {
    if (!v.is_string()) continue;
    if (!out.empty()) out += ",";
    out += v.get<std::string>();
  }
  return out;
}

std::string ServiceExternalIP(const json& svc) {
  const std::string type = Str(Field(svc, {"spec", "type"}), "ClusterIP");
  std::string external = JoinStrings(Field(svc, {"spec", "externalIPs"}));
  if (type == "ExternalName") return Str(Field(svc, {"spec", "externalName"}), "<none>");
  if (type == "LoadBalancer") {
    std::string lb;
    const json& ingress = Field(svc, {"status", "loadBalancer", "ingress"});
    if (ingress.is_array()) {
      for (const auto& i : ingress) {
        std::string v = Str(Field(i, {"ip"}), Str(Field(i, {"hostname"})));
        if (v.empty()) continue;
        if (!lb.empty()) lb += ",";
        lb += v;
      }
    }
    if (!external.empty()) lb = lb.empty() ? external : lb + "," + external;
    return lb.empty() ? "<pending>" : lb;
  }
  return external.empty() ? "<none>" : external;
}

std::string Selector(const json& sel) {
  if (!sel.is_object() || sel.empty()) return "<none>";
  std::string out;
  for (auto it = sel.begin(); it != sel.end(); ++it) {
    if (!out.empty()) out += ",";
    out += it.key() + "=" + Str(it.value());
  }
  return out;
}

// A metav1.LabelSelector as kubectl prints it: "app=x,tier in (a,b),!legacy".
std::string LabelSelectorCell(const json& sel) {
  if (!sel.is_object()) return "<none>";
  std::string out;
  auto add = [&](const std::string& part) { out += (out.empty() ? "" : ",") + part; };
  const json& labels = Field(sel, {"matchLabels"});
  if (labels.is_object()) {
    for (auto it = labels.begin(); it != labels.end(); ++it) add(it.key() + "=" + Str(it.value()));
  }
  const json& exprs = Field(sel, {"matchExpressions"});
  if (exprs.is_array()) {
    for (const json& e : exprs) {
      std::string key = Str(Field(e, {"key"})), op = Str(Field(e, {"operator"}));
      std::string values;
      const json& vs = Field(e, {"values"});
      if (vs.is_array()) {
        for (const json& v : vs) values += (values.empty() ? "" : ",") + Str(v);
      }
      if (op == "In") add(key + " in (" + values + ")");
      if (op == "NotIn") add(key + " notin (" + values + ")");
      if (op == "Exists") add(key);
      if (op == "DoesNotExist") add("!" + key);
    }
  }
  return out.empty() ? "<none>" : out;
}

// The template's containers' names or images, comma-separated (Deployment -o wide).
std::string TemplateContainers(const json& obj, const char* field) {
  std::string out;
  const json& cs = Field(obj, {"spec", "template", "spec", "containers"});
  if (!cs.is_array()) return out;
  for (const json& c : cs) out += (out.empty() ? "" : ",") + Str(Field(c, {field}));
  return out;
}

// A binding's subjects of one kind, comma-separated ("ns/name" for service accounts).
std::string Subjects(const json& obj, const std::string& kind) {
  std::string out;
  const json& subjects = Field(obj, {"subjects"});
  if (!subjects.is_array()) return out;
  for (const json& s : subjects) {
    if (Str(Field(s, {"kind"})) != kind) continue;
    std::string name = Str(Field(s, {"name"}));
    if (kind == "ServiceAccount") name = Str(Field(s, {"namespace"})) + "/" + name;
    out += (out.empty() ? "" : ", ") + name;
  }
  return out;
}

}  // namespace

std::string HumanDuration(Clock::duration d) {
  const int64_t total_seconds = std::chrono::duration_cast<std::chrono::seconds>(d).count();
  if (total_seconds < -1) return "<invalid>";
  if (total_seconds < 0) return "0s";
  if (total_seconds < 60 * 2) return std::to_string(total_seconds) + "s";
  const int64_t minutes = total_seconds / 60;
  if (minutes < 10) {
    const int64_t s = total_seconds % 60;
    return s == 0 ? std::to_string(minutes) + "m" : std::to_string(minutes) + "m" + std::to_string(s) + "s";
  }
  if (minutes < 60 * 3) return std::to_string(minutes) + "m";
  const int64_t hours = total_seconds / 3600;
  if (hours < 8) {
    const int64_t m = minutes % 60;
    return m == 0 ? std::to_string(hours) + "h" : std::to_string(hours) + "h" + std::to_string(m) + "m";
  }
  if (hours < 48) return std::to_string(hours) + "h";
  if (hours < 24 * 8) {
    const int64_t h = hours % 24;
    return h == 0 ? std::to_string(hours / 24) + "d" : std::to_string(hours / 24) + "d" + std::to_string(h) + "h";
  }
  if (hours < 24 * 365 * 2) return std::to_string(hours / 24) + "d";
  if (hours < 24 * 365 * 8) {
    const int64_t dy = (hours / 24) % 365;
    return dy == 0 ? std::to_string(hours / 24 / 365) + "y"
                   : std::to_string(hours / 24 / 365) + "y" + std::to_string(dy) + "d";
  }
  return std::to_string(hours / 24 / 365) + "y";
}

std::vector<FieldCause> CheckPrinterColumns(const json& columns, const std::string& field_prefix) {
  std::vector<FieldCause> out;
  if (columns.is_null()) return out;
  if (!columns.is_array()) {
    out.push_back({"FieldValueTypeInvalid", field_prefix, "Invalid value: " + gofmt::BadValue(columns) + ": must be an array"});
    return out;
  }
  static const std::vector<std::string> kTypes = {"boolean", "date", "integer", "number", "string"};
  static const std::vector<std::string> kFormats = {"byte", "date", "date-time", "double",
                                                    "float", "int32", "int64", "password"};
  auto join = [](const std::vector<std::string>& v) {
    std::string s;
    for (const auto& x : v) s += (s.empty() ? "" : ",") + x;
    return s;
  };
  auto quote = [](const std::string& s) { return gofmt::Quote(s); };
  for (size_t i = 0; i < columns.size(); ++i) {
    const std::string path = field_prefix + "[" + std::to_string(i) + "]";
    const json& c = columns[i];
    if (!c.is_object()) {
      out.push_back({"FieldValueTypeInvalid", path, "Invalid value: " + gofmt::BadValue(c) + ": must be an object"});
      continue;
    }
    const std::string name = Str(Field(c, {"name"}));
    const std::string type = Str(Field(c, {"type"}));
    const std::string format = Str(Field(c, {"format"}));
    const std::string jp = Str(Field(c, {"jsonPath"}));
    if (name.empty()) out.push_back({"FieldValueRequired", path + ".name", "Required value"});
    if (type.empty()) {
      out.push_back({"FieldValueRequired", path + ".type", "Required value: must be one of " + join(kTypes)});
    } else if (std::find(kTypes.begin(), kTypes.end(), type) == kTypes.end()) {
      out.push_back({"FieldValueInvalid", path + ".type",
                     "Invalid value: " + quote(type) + ": must be one of " + join(kTypes)});
    }
    if (!format.empty() && std::find(kFormats.begin(), kFormats.end(), format) == kFormats.end()) {
      out.push_back({"FieldValueInvalid", path + ".format",
                     "Invalid value: " + quote(format) + ": must be one of " + join(kFormats)});
    }
    if (jp.empty()) {
      out.push_back({"FieldValueRequired", path + ".jsonPath", "Required value"});
    } else if (jp[0] != '.' || !CheckJsonPath(jp).empty()) {
      out.push_back({"FieldValueInvalid", path + ".jsonPath",
                     "Invalid value: " + quote(jp) + ": must be a simple json path starting with ."});
    }
    const json& prio = Field(c, {"priority"});
    if (!prio.is_null() && !(prio.is_number_integer() && IntOf(prio) >= 0 && IntOf(prio) <= 2147483647)) {
      out.push_back({"FieldValueInvalid", path + ".priority",
                     "Invalid value: " + gofmt::BadValue(prio) + ": must be a non-negative 32-bit integer"});
    }
  }
  return out;
}

std::vector<PrinterColumn> ParsePrinterColumns(const json& version) {
  std::vector<PrinterColumn> out;
  const json* cols = nullptr;
  if (version.is_object()) {
    auto it = version.find("additionalPrinterColumns");
    if (it != version.end() && it->is_array()) cols = &*it;
  }
  if (!cols) return out;
  for (const auto& c : *cols) {
    if (!c.is_object()) continue;
    PrinterColumn col;
    col.name = Str(Field(c, {"name"}));
    col.type = Str(Field(c, {"type"}));
    col.format = Str(Field(c, {"format"}));
    col.description = Str(Field(c, {"description"}));
    col.json_path = Str(Field(c, {"jsonPath"}));
    const json& p = Field(c, {"priority"});
    if (p.is_number_integer()) col.priority = static_cast<int>(std::clamp<int64_t>(IntOf(p), 0, 2147483647));
    out.push_back(col);
  }
  return out;
}

json BuildTable(const std::vector<PrinterColumn>& columns, const std::vector<json>& objects,
                const std::string& include_object, Clock::time_point now) {
  std::vector<PrinterColumn> cols = columns;
  if (cols.empty()) {  // kube-apiserver serves an Age column for CRDs that define none
    PrinterColumn age;
    age.name = "Age";
    age.type = "date";
    age.description = kAgeDescription;
    age.json_path = ".metadata.creationTimestamp";
    cols.push_back(age);
  }
  json defs = json::array({Column("Name", "string", "name", kNameDescription)});
  for (const auto& c : cols) {
    std::string desc = c.description.empty()
                           ? "Custom resource definition column (in JSONPath format): " + c.json_path
                           : c.description;
    defs.push_back(Column(c.name, c.type, c.format, desc, c.priority));
  }
  json rows = json::array();
  for (const auto& obj : objects) {
    json cells = json::array({Str(Field(obj, {"metadata", "name"}))});
    for (const auto& c : cols) {
      std::vector<json> found;
      try {
        found = EvaluateJsonPath(c.json_path, obj);
      } catch (const std::invalid_argument&) {
        found.clear();  // a path the CRD check should have refused: show an empty cell
      }
      // Like the apiserver, the first match only (kubectl's own custom-columns joins all).
      cells.push_back(found.empty() ? json(nullptr) : Cell(c, found.front(), now));
    }
    rows.push_back(Row(std::move(cells), obj, include_object));
  }
  return Table(std::move(defs), std::move(rows));
}

json BuiltinTable(const std::string& resource, const std::vector<json>& objects,
                  const std::string& include_object, Clock::time_point now) {
  json defs;
  json rows = json::array();
  auto age = [&](const json& o) { return AgeCell(Field(o, {"metadata", "creationTimestamp"}), now); };
  auto name = [](const json& o) { return Str(Field(o, {"metadata", "name"})); };
  const json name_col = Column("Name", "string", "name", kNameDescription);
  const json age_col = Column("Age", "string", "", kAgeDescription);

  if (resource == "pods") {
    defs = json::array({name_col,
                        Column("Ready", "string", "", "The aggregate readiness state of this pod for accepting traffic."),
                        Column("Status", "string", "", "The aggregate status of the containers in this pod."),
                        Column("Restarts", "string", "", "The number of times the containers in this pod have been restarted and when the last container in this pod has restarted."),
                        age_col,
                        Column("IP", "string", "", "IP address allocated to the pod.", 1),
                        Column("Node", "string", "", "Name of the node the pod is assigned to.", 1),
                        Column("Nominated Node", "string", "", "Name of the node nominated for this pod.", 1),
                        Column("Readiness Gates", "string", "", "Pod readiness gates.", 1)});
    for (const auto& o : objects) rows.push_back(Row(PodCells(o, now), o, include_object));
  } else if (resource == "namespaces") {
    defs = json::array({name_col, Column("Status", "string", "", "The status of the namespace."), age_col});
    for (const auto& o : objects) {
      rows.push_back(Row(json::array({name(o), Str(Field(o, {"status", "phase"}), "Active"), age(o)}), o, include_object));
    }
  } else if (resource == "configmaps") {
    defs = json::array({name_col, Column("Data", "integer", "", "The number of keys in data and binaryData."), age_col});
    for (const auto& o : objects) {
      int64_t n = 0;
      for (const char* f : {"data", "binaryData"}) {
        const json& d = Field(o, {f});
        if (d.is_object()) n += static_cast<int64_t>(d.size());
      }
      rows.push_back(Row(json::array({name(o), n, age(o)}), o, include_object));
    }
  } else if (resource == "services") {
    defs = json::array({name_col, Column("Type", "string", "", "The type of the service."),
                        Column("Cluster-IP", "string", "", "The cluster IP of the service."),
                        Column("External-IP", "string", "", "The external IPs of the service."),
                        Column("Port(s)", "string", "", "The ports of the service."), age_col,
                        Column("Selector", "string", "", "The label selector of the service.", 1)});
    for (const auto& o : objects) {
      rows.push_back(Row(json::array({name(o), Str(Field(o, {"spec", "type"}), "ClusterIP"),
                                      Str(Field(o, {"spec", "clusterIP"}), "<none>"), ServiceExternalIP(o),
                                      ServicePorts(o), age(o), Selector(Field(o, {"spec", "selector"}))}),
                         o, include_object));
    }
  } else if (resource == "events") {
    defs = json::array({Column("Last Seen", "string", "", "Time since the event was last seen."),
                        Column("Type", "string", "", "The type of the event."),
                        Column("Reason", "string", "", "The reason of the event."),
                        Column("Object", "string", "", "The object the event is about."),
                        Column("Subobject", "string", "", "The field of the object the event is about.", 1),
                        Column("Source", "string", "", "The component that reported the event.", 1),
                        Column("Message", "string", "", "A human-readable description of the event."),
                        Column("First Seen", "string", "", "Time since the event was first seen.", 1),
                        Column("Count", "string", "", "How many times the event occurred.", 1),
                        Column("Name", "string", "name", kNameDescription, 1)});
    for (const auto& o : objects) {
      json last = Field(o, {"lastTimestamp"});
      if (!last.is_string()) last = Field(o, {"eventTime"});
      if (!last.is_string()) last = Field(o, {"metadata", "creationTimestamp"});
      json first = Field(o, {"firstTimestamp"});
      if (!first.is_string()) first = Field(o, {"eventTime"});
      std::string source = Str(Field(o, {"source", "component"}), Str(Field(o, {"reportingComponent"})));
      if (!Str(Field(o, {"source", "host"})).empty()) source += ", " + Str(Field(o, {"source", "host"}));
      std::string message = Str(Field(o, {"message"}));
      message.erase(0, message.find_first_not_of(" \t\n"));
      message.erase(message.find_last_not_of(" \t\n") + 1);
      const json& count = Field(o, {"count"});
      rows.push_back(Row(json::array({AgeCell(last, now), Str(Field(o, {"type"})), Str(Field(o, {"reason"})),
                                      Lower(Str(Field(o, {"involvedObject", "kind"}))) + "/" +
                                          Str(Field(o, {"involvedObject", "name"})),
                                      Str(Field(o, {"involvedObject", "fieldPath"})), source, message,
                                      AgeCell(first, now),
                                      std::to_string(IntOf(count, 1)), name(o)}),
                         o, include_object));
    }
  } else if (resource == "leases") {
    defs = json::array({name_col, Column("Holder", "string", "", "The holder of the lease."), age_col});
    for (const auto& o : objects) {
      rows.push_back(Row(json::array({name(o), Str(Field(o, {"spec", "holderIdentity"})), age(o)}), o, include_object));
    }
  } else if (resource == "deployments") {
    defs = json::array({name_col,
                        Column("Ready", "string", "", "Number of the pod with ready state"),
                        Column("Up-to-date", "string", "", "Total number of non-terminated pods targeted by this deployment that have the desired template spec."),
                        Column("Available", "string", "", "Total number of available pods (ready for at least minReadySeconds) targeted by this deployment."),
                        age_col,
                        Column("Containers", "string", "", "Names of each container in the template.", 1),
                        Column("Images", "string", "", "Images referenced by each container in the template.", 1),
                        Column("Selector", "string", "", "Label selector for pods.", 1)});
    for (const auto& o : objects) {
      const json& desired = Field(o, {"spec", "replicas"});
      std::string ready = std::to_string(IntOf(Field(o, {"status", "readyReplicas"}))) + "/" +
                          std::to_string(IntOf(desired, 1));
      rows.push_back(Row(json::array({name(o), ready, IntOf(Field(o, {"status", "updatedReplicas"})),
                                      IntOf(Field(o, {"status", "availableReplicas"})), age(o),
                                      TemplateContainers(o, "name"), TemplateContainers(o, "image"),
                                      LabelSelectorCell(Field(o, {"spec", "selector"}))}),
                         o, include_object));
    }
  } else if (resource == "serviceaccounts") {
    defs = json::array({name_col, Column("Secrets", "string", "", "Secrets is a list of the secrets in the same namespace that pods running using this ServiceAccount are allowed to use."), age_col});
    for (const auto& o : objects) {
      const json& secrets = Field(o, {"secrets"});
      int64_t n = secrets.is_array() ? static_cast<int64_t>(secrets.size()) : 0;
      rows.push_back(Row(json::array({name(o), n, age(o)}), o, include_object));
    }
  } else if (resource == "rolebindings" || resource == "clusterrolebindings") {
    defs = json::array({name_col, Column("Role", "string", "", "Role of the binding."), age_col,
                        Column("Users", "string", "", "Users in the binding.", 1),
                        Column("Groups", "string", "", "Groups in the binding.", 1),
                        Column("ServiceAccounts", "string", "", "ServiceAccounts in the binding.", 1)});
    for (const auto& o : objects) {
      std::string role = Str(Field(o, {"roleRef", "kind"})) + "/" + Str(Field(o, {"roleRef", "name"}));
      rows.push_back(Row(json::array({name(o), role, age(o), Subjects(o, "User"), Subjects(o, "Group"),
                                      Subjects(o, "ServiceAccount")}),
                         o, include_object));
    }
  } else {
    // rest.DefaultTableConvertor (CRDs and kinds without a printer): Name, Created At.
    defs = json::array({name_col, Column("Created At", "date", "", kAgeDescription)});
    for (const auto& o : objects) rows.push_back(Row(json::array({name(o), CreatedAt(o)}), o, include_object));
  }
  return Table(std::move(defs), std::move(rows));
}

}  // namespace meshwork::controlplane::schema
