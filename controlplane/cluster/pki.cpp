// Certificates by the openssl command: each file is made in a temporary name and renamed, so an
// interrupted run leaves no half-made pair that a later run would trust.
#include "controlplane/cluster/pki.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "common/subprocess.h"

namespace meshwork::controlplane::cluster {
namespace {

bool Exists(const std::string& path) {
  struct stat st{};
  return ::stat(path.c_str(), &st) == 0;
}

// Runs openssl with `args`; its output goes to `log` (shown in the error when it fails).
Status OpenSsl(const std::vector<std::string>& args, const std::string& log, const std::string& what) {
  SpawnOptions options;
  options.program = "openssl";
  options.search_path = true;
  options.argv = {"openssl"};
  options.argv.insert(options.argv.end(), args.begin(), args.end());
  for (char** e = environ; *e != nullptr; ++e) options.env.emplace_back(*e);
  FILE* out = std::fopen(log.c_str(), "w");
  if (out == nullptr) return IOError(log + ": " + std::strerror(errno));
  options.stdout_fd = options.stderr_fd = fileno(out);
  Spawned child = SpawnProcess(options);
  std::fclose(out);
  if (child.pid > 0) {
    int status = 0;
    while (::waitpid(child.pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (!child.failure && WIFEXITED(status) && WEXITSTATUS(status) == 0) return Status::Ok();
  }
  std::ifstream in(log);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (child.failure) text = "cannot run openssl (" + child.failure->ToString() + "): install the openssl package";
  return Internal(what + ": " + text);
}

std::string Subject(const std::string& cn, const std::vector<std::string>& groups) {
  std::string s;
  for (const std::string& g : groups) s += "/O=" + g;
  return s + "/CN=" + cn;
}

// A key and a certificate signed by the CA, with `extensions` (an openssl extension file's text).
Status MakeSigned(const std::string& dir, const std::string& name, const std::string& subject,
                  const std::string& extensions) {
  const std::string base = dir + "/" + name;
  // The extensions a certificate was made with are kept beside it (.ext): the same ones keep it.
  std::ifstream kept(base + ".ext");
  const std::string kept_extensions((std::istreambuf_iterator<char>(kept)), std::istreambuf_iterator<char>());
  const bool same = Exists(base + ".ext") && kept_extensions == extensions;
  if (Exists(base + ".crt") && Exists(base + ".key") && same) return Status::Ok();
  const std::string tmp = base + ".tmp";
  {
    std::ofstream ext(tmp + ".ext");
    ext << extensions;
  }
  MW_RETURN_IF_ERROR(OpenSsl({"req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                              "-keyout", tmp + ".key", "-out", tmp + ".csr", "-subj", subject},
                             tmp + ".log", base + ".key"));
  MW_RETURN_IF_ERROR(OpenSsl({"x509", "-req", "-in", tmp + ".csr", "-CA", dir + "/ca.crt", "-CAkey", dir + "/ca.key",
                              "-CAcreateserial", "-days", "3650", "-sha256", "-extfile", tmp + ".ext", "-out",
                              tmp + ".crt"},
                             tmp + ".log", base + ".crt"));
  if (::rename((tmp + ".key").c_str(), (base + ".key").c_str()) != 0 ||
      ::rename((tmp + ".crt").c_str(), (base + ".crt").c_str()) != 0) {
    return IOError(base + ": " + std::strerror(errno));
  }
  if (::rename((tmp + ".ext").c_str(), (base + ".ext").c_str()) != 0) return IOError(base + ".ext: " + std::strerror(errno));
  for (const char* suffix : {".csr", ".log"}) ::unlink((tmp + suffix).c_str());
  return Status::Ok();
}

}  // namespace

Status EnsurePki(const std::string& dir, const std::vector<std::string>& api_ips,
                 const std::vector<ClientIdentity>& identities) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return IOError(dir + ": " + std::strerror(errno));
  if (!Exists(dir + "/ca.crt") || !Exists(dir + "/ca.key")) {
    MW_RETURN_IF_ERROR(OpenSsl({"req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                                "-keyout", dir + "/ca.tmp.key", "-out", dir + "/ca.tmp.crt", "-days", "3650", "-subj",
                                "/CN=meshwork-local-ca", "-addext", "basicConstraints=critical,CA:TRUE", "-addext",
                                "keyUsage=critical,keyCertSign,cRLSign,digitalSignature"},
                               dir + "/ca.log", dir + "/ca.crt"));
    if (::rename((dir + "/ca.tmp.key").c_str(), (dir + "/ca.key").c_str()) != 0 ||
        ::rename((dir + "/ca.tmp.crt").c_str(), (dir + "/ca.crt").c_str()) != 0) {
      return IOError(dir + "/ca.crt: " + std::strerror(errno));
    }
    ::unlink((dir + "/ca.log").c_str());
  }
  const std::string common = "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n";
  std::string ips;
  for (const std::string& ip : api_ips) ips += "IP:" + ip + ",";
  MW_RETURN_IF_ERROR(MakeSigned(
      dir, "apiserver", "/CN=kube-apiserver",
      common + "extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1," + ips +
          "DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,"
          "DNS:kubernetes.default.svc.cluster.local\n"));
  // The node agent's kubelet API, which the API server calls for logs and checks against the CA.
  MW_RETURN_IF_ERROR(MakeSigned(dir, "kubelet", "/CN=meshwork-node-agent",
                                common + "extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n"));
  for (const ClientIdentity& id : identities) {
    MW_RETURN_IF_ERROR(
        MakeSigned(dir, id.file, Subject(id.common_name, id.groups), common + "extendedKeyUsage=clientAuth\n"));
  }
  if (!Exists(dir + "/sa.key") || !Exists(dir + "/sa.pub")) {
    MW_RETURN_IF_ERROR(OpenSsl({"genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out",
                                dir + "/sa.tmp.key"},
                               dir + "/sa.log", dir + "/sa.key"));
    MW_RETURN_IF_ERROR(
        OpenSsl({"pkey", "-in", dir + "/sa.tmp.key", "-pubout", "-out", dir + "/sa.pub"}, dir + "/sa.log", dir + "/sa.pub"));
    if (::rename((dir + "/sa.tmp.key").c_str(), (dir + "/sa.key").c_str()) != 0) {
      return IOError(dir + "/sa.key: " + std::strerror(errno));
    }
    ::unlink((dir + "/sa.log").c_str());
  }
  return Status::Ok();
}

}  // namespace meshwork::controlplane::cluster
