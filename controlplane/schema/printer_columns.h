// meta.k8s.io/v1 Tables for `kubectl get`: columns from a CRD's additionalPrinterColumns, and the
// default columns of the built-in kinds the control plane serves. Pure functions, thread-safe.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "controlplane/schema/openapi.h"

namespace meshwork::controlplane::schema {

struct PrinterColumn {
  std::string name;
  std::string type;         // integer, number, string, boolean, date
  std::string format;
  std::string description;
  std::string json_path;    // ".status.phase", ".status.conditions[?(@.type==\"Ready\")].status"
  int priority = 0;
};

// Columns of one CRD spec.versions[] entry (its additionalPrinterColumns; empty if none).
std::vector<PrinterColumn> ParsePrinterColumns(const nlohmann::json& version);

// A meta.k8s.io/v1 Table for custom resources, as kube-apiserver's CRD table convertor builds it.
// columnDefinitions: Name first, then `columns` in order; an Age column (type date, from
// .metadata.creationTimestamp) is added only when `columns` is empty. One row per object; each
// cell is the FIRST value the column's JSONPath finds (.a.b, .a[0].b, .a[*].b, .a['k'],
// .a[?(@.k=="v")].b, .metadata.labels.key), typed by the column (integer, number, boolean,
// string; "date" becomes a HumanDuration age relative to `now`); nothing found = a null cell.
// Each row's "object" is a PartialObjectMetadata ("Metadata", the default), the whole object
// ("Object"), or absent ("None"). The Table's metadata is {}: the caller sets resourceVersion.
nlohmann::json BuildTable(const std::vector<PrinterColumn>& columns,
                          const std::vector<nlohmann::json>& objects,
                          const std::string& include_object,
                          std::chrono::system_clock::time_point now);

// The Table for built-in kinds, with kube-apiserver's printer columns (priority-1 columns, shown
// by `kubectl get -o wide`, in brackets): pods (Name, Ready, Status, Restarts, Age, [IP, Node,
// Nominated Node, Readiness Gates]), namespaces (Name, Status, Age), configmaps (Name, Data, Age),
// services (Name, Type, Cluster-IP, External-IP, Port(s), Age, [Selector]), events (Last Seen,
// Type, Reason, Object, [Subobject, Source], Message, [First Seen, Count, Name]), leases (Name,
// Holder, Age); any other resource, customresourcedefinitions included, gets the default
// convertor's Name and Created At.
nlohmann::json BuiltinTable(const std::string& resource,
                            const std::vector<nlohmann::json>& objects,
                            const std::string& include_object,
                            std::chrono::system_clock::time_point now);

// Kubernetes' duration.HumanDuration: "0s".."119s", "2m".."9m59s", "10m".."179m", "3h".."7h59m",
// "8h".."47h", "2d".."7d23h", "8d".."729d", "2y".."7y364d", then "8y"...; "<invalid>" below -1s.
std::string HumanDuration(std::chrono::system_clock::duration d);

// Evaluates a printer-column JSONPath against `object`. Returns the matched values (empty when
// nothing matches). Throws std::invalid_argument on a path it cannot parse.
std::vector<nlohmann::json> EvaluateJsonPath(const std::string& path, const nlohmann::json& object);

// Checks a column's JSONPath parses; empty string when fine, else a message naming the problem.
std::string CheckJsonPath(const std::string& path);

// Checks a CRD version's additionalPrinterColumns as kube-apiserver does before accepting the
// CRD (name and type required, known type and format, a simple JSONPath starting with ".").
// Field paths start with `field_prefix`, e.g. "spec.versions[0].additionalPrinterColumns".
std::vector<FieldCause> CheckPrinterColumns(const nlohmann::json& columns,
                                            const std::string& field_prefix);

}  // namespace meshwork::controlplane::schema
