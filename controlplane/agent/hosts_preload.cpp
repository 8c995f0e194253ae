// LD_PRELOAD shim for pods when no private mount namespace is allowed: answers getaddrinfo and
// gethostbyname* for the names in the hosts file named by $MESHWORK_HOSTS_FILE (re-read on every
// lookup, so new names show at once) and defers everything else to libc. Plain C on purpose: it
// is loaded into every process a pod starts, so it allocates little and uses no C++ runtime.
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

namespace {

constexpr size_t kMaxFile = 1 << 20;

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\r'; }

// Looks `name` up in the hosts file; true and *addr set when an IPv4 line names it. Names the
// system answers well itself (localhost, ip6-*) are left to libc.
bool Lookup(const char* name, in_addr* addr) {
  const char* path = getenv("MESHWORK_HOSTS_FILE");
  if (path == nullptr || *path == '\0' || name == nullptr || *name == '\0') return false;
  size_t name_len = strlen(name);
  while (name_len > 0 && name[name_len - 1] == '.') --name_len;
  if (name_len == 0 || name_len > 255) return false;
  if (strncasecmp(name, "localhost", 9) == 0 || strncasecmp(name, "ip6-", 4) == 0) return false;

  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char* buf = static_cast<char*>(malloc(kMaxFile + 1));
  if (buf == nullptr) {
    close(fd);
    return false;
  }
  size_t len = 0;
  while (len < kMaxFile) {
    ssize_t n = read(fd, buf + len, kMaxFile - len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    len += static_cast<size_t>(n);
  }
  close(fd);
  buf[len] = '\0';

  bool found = false;
  char* line = buf;
  while (!found && line < buf + len) {
    char* end = strchr(line, '\n');
    if (end == nullptr) end = buf + len;
    *end = '\0';
    char* hash = strchr(line, '#');
    if (hash != nullptr) *hash = '\0';
    // First field: the address; the rest: names.
    char* p = line;
    while (IsSpace(*p)) ++p;
    char* ip = p;
    while (*p != '\0' && !IsSpace(*p)) ++p;
    bool more = *p != '\0';
    *p = '\0';
    in_addr candidate{};
    if (*ip != '\0' && more && inet_pton(AF_INET, ip, &candidate) == 1) {
      ++p;
      while (*p != '\0') {
        while (IsSpace(*p)) ++p;
        char* word = p;
        while (*p != '\0' && !IsSpace(*p)) ++p;
        size_t word_len = static_cast<size_t>(p - word);
        if (word_len == name_len && strncasecmp(word, name, name_len) == 0) {
          *addr = candidate;
          found = true;
          break;
        }
      }
    }
    line = end + 1;
  }
  free(buf);
  return found;
}

template <typename F>
F Next(const char* symbol) {
  return reinterpret_cast<F>(dlsym(RTLD_NEXT, symbol));
}

// Fills `ret` inside the caller's buffer; ERANGE when it is too small.
int FillHostent(const char* name, const in_addr& addr, hostent* ret, char* buf, size_t buflen) {
  size_t name_len = strlen(name) + 1;
  size_t need = sizeof(char*) * 4 + sizeof(in_addr) + name_len + alignof(char*);
  if (buflen < need) return ERANGE;
  // Pointers first (aligned), then the address, then the name.
  uintptr_t base = reinterpret_cast<uintptr_t>(buf);
  size_t pad = (alignof(char*) - base % alignof(char*)) % alignof(char*);
  char** ptrs = reinterpret_cast<char**>(buf + pad);
  char* addr_copy = reinterpret_cast<char*>(ptrs + 4);
  memcpy(addr_copy, &addr, sizeof(addr));
  char* name_copy = addr_copy + sizeof(in_addr);
  memcpy(name_copy, name, name_len);
  ptrs[0] = addr_copy;  // h_addr_list
  ptrs[1] = nullptr;
  ptrs[2] = nullptr;  // h_aliases
  ptrs[3] = nullptr;
  ret->h_name = name_copy;
  ret->h_aliases = ptrs + 2;
  ret->h_addrtype = AF_INET;
  ret->h_length = sizeof(in_addr);
  ret->h_addr_list = ptrs;
  return 0;
}

thread_local hostent tls_host;
thread_local char tls_buf[512];

}  // namespace

extern "C" {

__attribute__((visibility("default"))) int getaddrinfo(const char* node, const char* service, const addrinfo* hints,
                                                       addrinfo** res) {
  using Fn = int (*)(const char*, const char*, const addrinfo*, addrinfo**);
  static Fn real = Next<Fn>("getaddrinfo");
  if (real == nullptr) return EAI_SYSTEM;
  in_addr addr{};
  if (node != nullptr && Lookup(node, &addr)) {
    // Let libc build the answer from the numeric address: its freeaddrinfo then frees it.
    char ip[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &addr, ip, sizeof(ip));
    addrinfo h{};
    if (hints != nullptr) h = *hints;
    h.ai_flags |= AI_NUMERICHOST;
    int rc = real(ip, service, &h, res);
    // The canonical name is the one asked for, not the address. glibc frees ai_canonname on
    // its own in freeaddrinfo, so swapping the string is safe.
    if (rc == 0 && *res != nullptr && (*res)->ai_canonname != nullptr) {
      char* name = strdup(node);
      if (name != nullptr) {
        free((*res)->ai_canonname);
        (*res)->ai_canonname = name;
      }
    }
    return rc;
  }
  return real(node, service, hints, res);
}

__attribute__((visibility("default"))) int gethostbyname2_r(const char* name, int af, hostent* ret, char* buf,
                                                            size_t buflen, hostent** result, int* h_errnop) {
  using Fn = int (*)(const char*, int, hostent*, char*, size_t, hostent**, int*);
  static Fn real = Next<Fn>("gethostbyname2_r");
  in_addr addr{};
  if (Lookup(name, &addr)) {
    *result = nullptr;
    if (af != AF_INET) {  // the name is ours and has no IPv6 address: answer now, do not ask DNS
      if (h_errnop != nullptr) *h_errnop = NO_DATA;
      return 0;
    }
    int err = FillHostent(name, addr, ret, buf, buflen);
    if (err != 0) {
      if (h_errnop != nullptr) *h_errnop = NETDB_INTERNAL;
      return err;
    }
    *result = ret;
    return 0;
  }
  if (real == nullptr) return ENOSYS;
  return real(name, af, ret, buf, buflen, result, h_errnop);
}

__attribute__((visibility("default"))) int gethostbyname_r(const char* name, hostent* ret, char* buf, size_t buflen,
                                                           hostent** result, int* h_errnop) {
  using Fn = int (*)(const char*, hostent*, char*, size_t, hostent**, int*);
  static Fn real = Next<Fn>("gethostbyname_r");
  in_addr addr{};
  if (Lookup(name, &addr)) return gethostbyname2_r(name, AF_INET, ret, buf, buflen, result, h_errnop);
  if (real == nullptr) return ENOSYS;
  return real(name, ret, buf, buflen, result, h_errnop);
}

__attribute__((visibility("default"))) hostent* gethostbyname2(const char* name, int af) {
  using Fn = hostent* (*)(const char*, int);
  static Fn real = Next<Fn>("gethostbyname2");
  in_addr addr{};
  if (Lookup(name, &addr)) {
    hostent* result = nullptr;
    int herr = 0;
    gethostbyname2_r(name, af, &tls_host, tls_buf, sizeof(tls_buf), &result, &herr);
    if (result == nullptr) h_errno = herr;
    return result;
  }
  return real != nullptr ? real(name, af) : nullptr;
}

__attribute__((visibility("default"))) hostent* gethostbyname(const char* name) {
  using Fn = hostent* (*)(const char*);
  static Fn real = Next<Fn>("gethostbyname");
  in_addr addr{};
  if (Lookup(name, &addr)) return gethostbyname2(name, AF_INET);
  return real != nullptr ? real(name) : nullptr;
}

}  // extern "C"
