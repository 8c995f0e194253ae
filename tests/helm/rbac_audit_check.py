#!/usr/bin/env python3
"""Checks that a rendered chart's RBAC allows every API call a client really made.

Reads kube-apiserver's audit log (meshwork-cluster's DIR/logs/audit.log, audit.k8s.io/v1
Events, one JSON object a line), which records each request with its authorization attributes.
kube-apiserver enforces RBAC, so a call it denied (403) fails the check as well. This takes the
calls whose userAgent starts with USER_AGENT_PREFIX and matches each (apiGroup,
resource[/subresource], verb, namespace) against the rules of every ClusterRole (any namespace)
and Role (its own namespace) in the rendered YAML, as Kubernetes' RBAC authorizer matches rules
("*" wildcards, "*/subresource"). resourceNames and bindings are not looked at: the chart uses
no resourceNames, and binds each of its roles to the operator.

usage: rbac_audit_check.py AUDIT_JSONL RENDERED_YAML USER_AGENT_PREFIX
Prints every distinct call and whether it is covered. Exit 0: all covered; 1: some call is not
covered, or no call from that user agent was logged at all; 2: bad input.
"""
import collections
import json
import sys

import yaml


def fatal(message):
    print(f"rbac_audit_check: {message}", file=sys.stderr)
    sys.exit(2)


def load_roles(path):
    """[(description, namespace or None for a ClusterRole, rules)] from a multi-document YAML file."""
    try:
        with open(path) as f:
            docs = list(yaml.safe_load_all(f))
    except (OSError, yaml.YAMLError) as e:
        fatal(f"{path}: {e}")
    roles = []
    for doc in docs:
        if not isinstance(doc, dict) or doc.get("kind") not in ("ClusterRole", "Role"):
            continue
        meta = doc.get("metadata") or {}
        name = f"{doc['kind']} {meta.get('name', '?')}"
        namespace = None
        if doc["kind"] == "Role":
            namespace = meta.get("namespace")
            if not namespace:
                fatal(f"{path}: {name} has no metadata.namespace (render with -n NAMESPACE)")
            name = f"Role {namespace}/{meta.get('name', '?')}"
        rules = doc.get("rules") or []
        for rule in rules:
            if rule.get("resourceNames"):
                fatal(f"{path}: {name} has a rule with resourceNames, which this check does not model")
        roles.append((name, namespace, rules))
    return roles


def resource_matches(rule_resource, resource, subresource):
    # As k8s.io/kubernetes/pkg/apis/rbac/v1 ResourceMatches.
    combined = f"{resource}/{subresource}" if subresource else resource
    if rule_resource in ("*", combined):
        return True
    return bool(subresource) and rule_resource == f"*/{subresource}"


def rule_allows(rule, group, resource, subresource, verb):
    groups = rule.get("apiGroups") or []
    verbs = rule.get("verbs") or []
    return ((group in groups or "*" in groups) and (verb in verbs or "*" in verbs) and
            any(resource_matches(r, resource, subresource) for r in rule.get("resources") or []))


def covering_role(roles, call):
    verb, group, resource, subresource, namespace = call
    for name, role_namespace, rules in roles:
        if role_namespace is not None and role_namespace != namespace:
            continue
        if any(rule_allows(rule, group, resource, subresource, verb) for rule in rules):
            return name
    return None


def load_calls(path, prefix):
    """Counters of (verb, apiGroup, resource, subresource, namespace) for lines from the user agent:
    every call, and those the API server answered 403 (kube-apiserver's log only)."""
    calls = collections.Counter()
    denied = collections.Counter()
    try:
        with open(path) as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    event = json.loads(line)
                    if not event.get("userAgent", "").startswith(prefix):
                        continue
                    if event.get("kind") == "Event" and event.get("apiVersion") == "audit.k8s.io/v1":
                        # kube-apiserver's audit log (meshwork-cluster): one event per stage.
                        ref = event.get("objectRef")
                        if ref is None:
                            continue  # a non-resource URL (discovery, /version)
                        call = (event["verb"], ref.get("apiGroup", ""), ref["resource"],
                                ref.get("subresource", ""), ref.get("namespace", ""))
                        calls[call] += 1
                        if event.get("responseStatus", {}).get("code") == 403:
                            denied[call] += 1
                        continue
                    calls[(event["verb"], event["apiGroup"], event["resource"], event["subresource"],
                           event["namespace"])] += 1
                except (ValueError, KeyError, AttributeError) as e:
                    fatal(f"{path}:{number}: not an audit line ({e!r}): {line.strip()[:200]}")
    except OSError as e:
        fatal(f"{path}: {e}")
    return calls, denied


def describe(call):
    verb, group, resource, subresource, namespace = call
    what = f"{resource}/{subresource}" if subresource else resource
    where = f"in {namespace}" if namespace else "cluster-wide"
    return f"{verb:<16} {group or '(core)':<20} {what:<24} {where:<22}"


def main(argv):
    if len(argv) != 4:
        fatal("usage: rbac_audit_check.py AUDIT_JSONL RENDERED_YAML USER_AGENT_PREFIX")
    audit, rendered, prefix = argv[1:]
    if not prefix:
        fatal("USER_AGENT_PREFIX must not be empty")
    roles = load_roles(rendered)
    calls, denied = load_calls(audit, prefix)
    if not calls:
        print(f"rbac_audit_check: no API call with a user agent starting with {prefix!r} in {audit}: "
              "nothing was checked")
        return 1
    print(f"{len(calls)} distinct API calls from {prefix!r} ({sum(calls.values())} requests), "
          f"against {len(roles)} roles in {rendered}:")
    uncovered = []
    for call in sorted(calls, key=lambda c: (c[1], c[2], c[3], c[0], c[4])):
        by = covering_role(roles, call)
        if by is None:
            uncovered.append(call)
        status = f"covered by {by}" if by else "NOT COVERED"
        if denied[call]:
            status += f", DENIED {denied[call]}x by the API server"
        print(f"  {describe(call)}  x{calls[call]:<5} {status}")
    if uncovered:
        print(f"{len(uncovered)} of {len(calls)} distinct calls are not allowed by any rule:")
        for call in uncovered:
            print(f"  {describe(call).rstrip()}")
        return 1
    if denied:
        print(f"{len(denied)} distinct calls were denied (403) by the API server's RBAC")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
