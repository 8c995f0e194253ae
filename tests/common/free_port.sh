# The port picker of every bash test that starts a server or a rendezvous: source it.
# shellcheck shell=bash

# free_port: a port that is free on every address, from 61000-64999, above the kernel's
# ephemeral range (32768-60999 here): a port the kernel picked could be taken by any outgoing
# connection before the test binds it (seen: a Pod's 0.0.0.0 metrics port taken under load).
# Each pick is recorded in $TMPDIR/meshwork-port-picks, as meshwork-cluster's and the C++ tests'
# picks are (common/loopback_port.h: ClaimPortPick): no other pick takes it for 10 minutes.
free_port() {
  python3 - <<'PY'
import errno, os, random, socket, time
picks = os.path.join(os.environ.get("TMPDIR") or "/tmp", "meshwork-port-picks")

def claim(port):
    try:
        os.makedirs(picks, exist_ok=True)
        os.close(os.open(os.path.join(picks, str(port)), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        return True
    except FileExistsError:
        path = os.path.join(picks, str(port))
        try:
            if time.time() - os.stat(path).st_mtime < 600:
                return False
            os.utime(path)
        except OSError:
            pass
        return True
    except OSError:
        return True  # nothing can be recorded: every port may be picked

for _ in range(200):
    port = random.randrange(61000, 65000)
    if not claim(port):
        continue
    s = socket.socket()
    try:
        s.bind(("0.0.0.0", port))
    except OSError:
        continue
    finally:
        s.close()
    print(port)
    break
else:
    raise SystemExit("no free port in 61000-64999")
PY
}
