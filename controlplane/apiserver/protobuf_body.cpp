// A minimal protobuf wire-format reader and the field numbers of the kinds decoded
// (k8s.io/api/core/v1 and k8s.io/apimachinery meta/v1 generated.proto).
#include "controlplane/apiserver/protobuf_body.h"

#include <cstdint>
#include <string_view>

#include "common/base64.h"

namespace meshwork::controlplane {
namespace {

using nlohmann::json;

class Reader {
 public:
  explicit Reader(std::string_view data) : p_(data.data()), end_(data.data() + data.size()) {}
  bool ok() const { return ok_; }
  bool Done() const { return p_ >= end_ || !ok_; }

  // The next field's number and wire type; false at the end or on malformed input.
  bool Next(uint32_t* field, uint32_t* wire) {
    if (Done()) return false;
    uint64_t key = Varint();
    *field = static_cast<uint32_t>(key >> 3);
    *wire = static_cast<uint32_t>(key & 7);
    return ok_ && *field != 0;
  }
  uint64_t Varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (p_ >= end_) break;
      uint8_t b = static_cast<uint8_t>(*p_++);
      v |= static_cast<uint64_t>(b & 0x7F) << shift;
      if (!(b & 0x80)) return v;
    }
    ok_ = false;
    return 0;
  }
  std::string_view Bytes() {
    uint64_t n = Varint();
    if (!ok_ || n > static_cast<uint64_t>(end_ - p_)) {
      ok_ = false;
      return {};
    }
    std::string_view s(p_, static_cast<size_t>(n));
    p_ += n;
    return s;
  }
  void Skip(uint32_t wire) {
    switch (wire) {
      case 0: Varint(); break;
      case 1: Advance(8); break;
      case 2: Bytes(); break;
      case 5: Advance(4); break;
      default: ok_ = false;
    }
  }

 private:
  void Advance(size_t n) {
    if (static_cast<size_t>(end_ - p_) < n) {
      ok_ = false;
      return;
    }
    p_ += n;
  }
  const char* p_;
  const char* end_;
  bool ok_ = true;
};

std::string Str(std::string_view s) { return std::string(s); }

// Go writes unset optional scalars too ("" and 0); in JSON they are absent.
void SetIf(json& obj, const char* key, std::string value) {
  if (!value.empty()) obj[key] = std::move(value);
}
void SetIf(json& obj, const char* key, int32_t value) {
  if (value != 0) obj[key] = value;
}

// A map<string,string> entry (key = 1, value = 2).
std::pair<std::string, std::string> MapEntry(std::string_view bytes, bool* ok) {
  Reader r(bytes);
  std::pair<std::string, std::string> kv;
  uint32_t f, w;
  while (r.Next(&f, &w)) {
    if (f == 1 && w == 2) kv.first = Str(r.Bytes());
    else if (f == 2 && w == 2) kv.second = Str(r.Bytes());
    else r.Skip(w);
  }
  *ok = *ok && r.ok();
  return kv;
}

json OwnerReference(std::string_view bytes, bool* ok) {
  Reader r(bytes);
  json o = json::object();
  uint32_t f, w;
  while (r.Next(&f, &w)) {
    if (f == 1 && w == 2) SetIf(o, "kind", Str(r.Bytes()));
    else if (f == 3 && w == 2) SetIf(o, "name", Str(r.Bytes()));
    else if (f == 4 && w == 2) SetIf(o, "uid", Str(r.Bytes()));
    else if (f == 5 && w == 2) SetIf(o, "apiVersion", Str(r.Bytes()));
    else if (f == 6 && w == 0) o["controller"] = r.Varint() != 0;
    else if (f == 7 && w == 0) o["blockOwnerDeletion"] = r.Varint() != 0;
    else r.Skip(w);
  }
  *ok = *ok && r.ok();
  return o;
}

json ObjectMeta(std::string_view bytes, bool* ok) {
  Reader r(bytes);
  json m = json::object();
  uint32_t f, w;
  while (r.Next(&f, &w)) {
    if (f == 1 && w == 2) SetIf(m, "name", Str(r.Bytes()));
    else if (f == 2 && w == 2) SetIf(m, "generateName", Str(r.Bytes()));
    else if (f == 3 && w == 2) SetIf(m, "namespace", Str(r.Bytes()));
    else if (f == 6 && w == 2) SetIf(m, "resourceVersion", Str(r.Bytes()));
    else if ((f == 11 || f == 12) && w == 2) {
      auto kv = MapEntry(r.Bytes(), ok);
      m[f == 11 ? "labels" : "annotations"][kv.first] = kv.second;
    } else if (f == 13 && w == 2) m["ownerReferences"].push_back(OwnerReference(r.Bytes(), ok));
    else if (f == 14 && w == 2) m["finalizers"].push_back(Str(r.Bytes()));
    else r.Skip(w);
  }
  *ok = *ok && r.ok();
  return m;
}

json IntOrString(std::string_view bytes, bool* ok) {
  Reader r(bytes);
  int64_t type = 0, iv = 0;
  std::string sv;
  uint32_t f, w;
  while (r.Next(&f, &w)) {
    if (f == 1 && w == 0) type = static_cast<int64_t>(r.Varint());
    else if (f == 2 && w == 0) iv = static_cast<int32_t>(r.Varint());
    else if (f == 3 && w == 2) sv = Str(r.Bytes());
    else r.Skip(w);
  }
  *ok = *ok && r.ok();
  return type == 1 ? json(sv) : json(iv);
}

json ServicePort(std::string_view bytes, bool* ok) {
  Reader r(bytes);
  json p = json::object();
  uint32_t f, w;
  while (r.Next(&f, &w)) {
    if (f == 1 && w == 2) SetIf(p, "name", Str(r.Bytes()));
    else if (f == 2 && w == 2) SetIf(p, "protocol", Str(r.Bytes()));
    else if (f == 3 && w == 0) SetIf(p, "port", static_cast<int32_t>(r.Varint()));
    else if (f == 4 && w == 2) p["targetPort"] = IntOrString(r.Bytes(), ok);
    else if (f == 5 && w == 0) SetIf(p, "nodePort", static_cast<int32_t>(r.Varint()));
    else r.Skip(w);
  }
  *ok = *ok && r.ok();
  return p;
}

json ServiceSpec(std::string_view bytes, bool* ok) {
  Reader r(bytes);
  json s = json::object();
  uint32_t f, w;
  while (r.Next(&f, &w)) {
    if (f == 1 && w == 2) s["ports"].push_back(ServicePort(r.Bytes(), ok));
    else if (f == 2 && w == 2) {
      auto kv = MapEntry(r.Bytes(), ok);
      s["selector"][kv.first] = kv.second;
    } else if (f == 3 && w == 2) SetIf(s, "clusterIP", Str(r.Bytes()));
    else if (f == 4 && w == 2) SetIf(s, "type", Str(r.Bytes()));
    else if (f == 10 && w == 2) SetIf(s, "externalName", Str(r.Bytes()));
    else r.Skip(w);
  }
  *ok = *ok && r.ok();
  return s;
}

}  // namespace

Result<json> DecodeProtobufObject(const std::string& body) {
  if (body.size() < 4 || body.compare(0, 4, std::string("k8s\0", 4)) != 0) {
    return InvalidInput("protobuf body does not start with the \"k8s\\0\" magic");
  }
  Reader env(std::string_view(body).substr(4));
  std::string api_version, kind;
  std::string_view raw;
  uint32_t f, w;
  while (env.Next(&f, &w)) {
    if (f == 1 && w == 2) {
      Reader tm(env.Bytes());
      uint32_t tf, tw;
      while (tm.Next(&tf, &tw)) {
        if (tf == 1 && tw == 2) api_version = Str(tm.Bytes());
        else if (tf == 2 && tw == 2) kind = Str(tm.Bytes());
        else tm.Skip(tw);
      }
    } else if (f == 2 && w == 2) {
      raw = env.Bytes();
    } else {
      env.Skip(w);
    }
  }
  if (!env.ok()) return InvalidInput("malformed protobuf envelope");
  if (api_version != "v1" ||
      (kind != "Namespace" && kind != "ConfigMap" && kind != "Service" && kind != "ServiceAccount")) {
    return InvalidInput("protobuf bodies are accepted only for v1 Namespace, ConfigMap, Service and ServiceAccount, not " +
                        api_version + " " + kind + "; send JSON");
  }
  json obj = {{"apiVersion", api_version}, {"kind", kind}};
  bool ok = true;
  Reader r(raw);
  while (r.Next(&f, &w)) {
    if (f == 1 && w == 2) {
      obj["metadata"] = ObjectMeta(r.Bytes(), &ok);
    } else if (kind == "ConfigMap" && f == 2 && w == 2) {
      auto kv = MapEntry(r.Bytes(), &ok);
      obj["data"][kv.first] = kv.second;
    } else if (kind == "ConfigMap" && f == 3 && w == 2) {
      auto kv = MapEntry(r.Bytes(), &ok);
      obj["binaryData"][kv.first] = Base64Encode(kv.second);
    } else if (kind == "ConfigMap" && f == 4 && w == 0) {
      obj["immutable"] = r.Varint() != 0;
    } else if (kind == "Namespace" && f == 2 && w == 2) {
      Reader spec(r.Bytes());
      uint32_t sf, sw;
      obj["spec"] = json::object();
      while (spec.Next(&sf, &sw)) {
        if (sf == 1 && sw == 2) obj["spec"]["finalizers"].push_back(Str(spec.Bytes()));
        else spec.Skip(sw);
      }
    } else if (kind == "Service" && f == 2 && w == 2) {
      obj["spec"] = ServiceSpec(r.Bytes(), &ok);
    } else if (kind == "ServiceAccount" && f == 3 && w == 0) {
      obj["automountServiceAccountToken"] = r.Varint() != 0;
    } else {
      r.Skip(w);
    }
  }
  if (!r.ok() || !ok) return InvalidInput("malformed protobuf " + kind);
  return obj;
}

}  // namespace meshwork::controlplane
