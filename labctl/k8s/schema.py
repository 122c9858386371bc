"""The fields, types and required keys of the two Kubernetes APIs ddplab writes and reads, as JSON
Schema: Kubeflow Trainer's TrainJob (trainer.kubeflow.org/v1alpha1) and JobSet
(jobset.x-k8s.io/v1alpha2), with the core/v1 and batch/v1 types they embed.

These are ddplab's own statement of the facts in the published CRDs (kubeflow/trainer's
manifests/base/crds/trainer.kubeflow.org_trainjobs.yaml and pkg/apis/trainer/v1alpha1/
trainjob_types.go; kubernetes-sigs/jobset's api/jobset/v1alpha2/jobset_types.go), covering what a
training job uses: `k8s export` writes only these fields and the tests validate every manifest it
writes against them; `k8s run` validates what it reads, so an ill-typed field (`numNodes: three`)
is named before anything starts. Where ddplab does not read a part (a pod's volumes, affinity,
an initializer) the schema only says it is an object, and `k8s run` lists it as not honoured.

`additionalProperties: false` where the API server's structural schema would refuse an unknown
field (kubectl's default field validation is strict): a misspelt `numnodes` is an error here too.
"""

from __future__ import annotations

from typing import Any

Schema = dict[str, Any]

STRING: Schema = {"type": "string"}
STRINGS: Schema = {"type": "array", "items": STRING}
BOOLEAN: Schema = {"type": "boolean"}
OBJECT: Schema = {"type": "object"}  # a part ddplab does not read: only its type is checked
STRING_MAP: Schema = {"type": "object", "additionalProperties": STRING}
# int-or-string (x-kubernetes-int-or-string): a quantity such as 2, "500m", "4Gi".
QUANTITY: Schema = {"type": ["integer", "string"], "pattern": r"^[+]?[0-9.]+([eE][+-]?[0-9]+|[numkKMGTPE]i?)?$"}
# A DNS-1123 label, as metadata.name of both kinds must be (TrainJob names are DNS-1035: a letter first).
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_1035 = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"


def obj(properties: dict[str, Schema], required: tuple[str, ...] = (), closed: bool = True) -> Schema:
    """An object with these fields (and, `closed`, no others)."""
    schema: Schema = {"type": "object", "properties": properties, "additionalProperties": not closed}
    if required:
        schema["required"] = list(required)
    return schema


def integer(minimum: int | None = None, maximum: int | None = None) -> Schema:
    """int32 in the CRDs, with their bounds."""
    schema: Schema = {"type": "integer"}
    if minimum is not None:
        schema["minimum"] = minimum
    if maximum is not None:
        schema["maximum"] = maximum
    return schema


# core/v1 ------------------------------------------------------------------------------------------

ENV_VAR = obj({"name": STRING, "value": STRING, "valueFrom": OBJECT}, required=("name",))
RESOURCES = obj({"limits": {"type": "object", "additionalProperties": QUANTITY},
                 "requests": {"type": "object", "additionalProperties": QUANTITY},
                 "claims": {"type": "array", "items": OBJECT}})
CONTAINER = obj({
    "name": STRING, "image": STRING, "command": STRINGS, "args": STRINGS, "workingDir": STRING,
    "env": {"type": "array", "items": ENV_VAR}, "envFrom": {"type": "array", "items": OBJECT},
    "resources": RESOURCES, "ports": {"type": "array", "items": OBJECT}, "volumeMounts": {"type": "array", "items": OBJECT},
    "imagePullPolicy": {"enum": ["Always", "IfNotPresent", "Never"]}, "securityContext": OBJECT,
}, required=("name",), closed=False)  # a container has many more fields; these are the ones ddplab reads
POD_SPEC = obj({
    "containers": {"type": "array", "items": CONTAINER, "minItems": 1},
    "initContainers": {"type": "array", "items": CONTAINER},
    "restartPolicy": {"enum": ["Always", "OnFailure", "Never"]},
    "subdomain": STRING, "hostname": STRING, "volumes": {"type": "array", "items": OBJECT},
    "nodeSelector": STRING_MAP, "tolerations": {"type": "array", "items": OBJECT}, "affinity": OBJECT,
}, required=("containers",), closed=False)
METADATA = obj({"name": {"type": "string", "pattern": DNS_LABEL, "maxLength": 63}, "namespace": STRING,
                "labels": STRING_MAP, "annotations": STRING_MAP}, closed=False)
POD_TEMPLATE = obj({"metadata": OBJECT, "spec": POD_SPEC}, required=("spec",))

# batch/v1 Job, as JobSet embeds it -----------------------------------------------------------------

JOB_SPEC = obj({
    "parallelism": integer(0), "completions": integer(0), "completionMode": {"enum": ["NonIndexed", "Indexed"]},
    "backoffLimit": integer(0), "activeDeadlineSeconds": integer(1), "ttlSecondsAfterFinished": integer(0),
    "template": POD_TEMPLATE,
}, required=("template",), closed=False)

# Kubeflow Trainer: TrainJob -------------------------------------------------------------------------

RUNTIME_REF = obj({
    "name": {"type": "string", "minLength": 1, "maxLength": 253},
    "apiGroup": {"type": "string", "maxLength": 253},  # default trainer.kubeflow.org
    "kind": {"type": "string", "maxLength": 253},  # default ClusterTrainingRuntime (or TrainingRuntime)
}, required=("name",))
TRAINER = obj({
    "image": {"type": "string", "maxLength": 500}, "command": STRINGS, "args": STRINGS,
    "env": {"type": "array", "items": ENV_VAR},
    "numNodes": integer(1),
    # An integer since Trainer 2.2 (int-or-string before; the runtime's own mlPolicy.torch.numProcPerNode went).
    "numProcPerNode": integer(1),
    "resourcesPerNode": RESOURCES,
})
# Trainer 2.2 replaced spec.labels, spec.annotations and spec.podTemplateOverrides with runtimePatches: a
# manifest written for 2.1 with them is refused by the API server, and here.
TRAINJOB: Schema = obj({
    "apiVersion": {"const": "trainer.kubeflow.org/v1alpha1"},
    "kind": {"const": "TrainJob"},
    "metadata": obj({**METADATA["properties"], "name": {"type": "string", "pattern": DNS_1035, "maxLength": 63}},
                    required=("name",), closed=False),
    "spec": obj({
        "runtimeRef": RUNTIME_REF,
        "trainer": TRAINER,
        "initializer": OBJECT,
        "runtimePatches": {"type": "array", "items": obj({"manager": {"type": "string", "minLength": 1}},
                                                          required=("manager",), closed=False)},
        "activeDeadlineSeconds": integer(1),
        "suspend": BOOLEAN,
        "managedBy": {"enum": ["trainer.kubeflow.org/trainjob-controller", "kueue.x-k8s.io/multikueue"]},
    }, required=("runtimeRef",)),
    "status": OBJECT,
}, required=("apiVersion", "kind", "metadata", "spec"))

# JobSet ----------------------------------------------------------------------------------------------

REPLICATED_JOB = obj({
    "name": {"type": "string", "pattern": DNS_LABEL, "maxLength": 63},
    "replicas": integer(0),
    "dependsOn": {"type": "array", "items": OBJECT},
    "groupName": STRING,
    "template": obj({"metadata": OBJECT, "spec": JOB_SPEC}, required=("spec",)),
}, required=("name", "template"))
JOBSET: Schema = obj({
    "apiVersion": {"const": "jobset.x-k8s.io/v1alpha2"},
    "kind": {"const": "JobSet"},
    "metadata": obj(METADATA["properties"], required=("name",), closed=False),
    "spec": obj({
        "replicatedJobs": {"type": "array", "items": REPLICATED_JOB, "minItems": 1},
        "network": obj({"enableDNSHostnames": BOOLEAN, "subdomain": STRING, "publishNotReadyAddresses": BOOLEAN}),
        "successPolicy": obj({"operator": {"enum": ["All", "Any"]}, "targetReplicatedJobs": STRINGS},
                             required=("operator",)),
        "failurePolicy": obj({"maxRestarts": integer(0), "rules": {"type": "array", "items": OBJECT},
                              "restartStrategy": STRING}),
        "startupPolicy": obj({"startupPolicyOrder": {"enum": ["AnyOrder", "InOrder"]}}, required=("startupPolicyOrder",)),
        "suspend": BOOLEAN,
        "managedBy": STRING,
        "ttlSecondsAfterFinished": integer(0),
        "coordinator": OBJECT,
    }, required=("replicatedJobs",)),
    "status": OBJECT,
}, required=("apiVersion", "kind", "metadata", "spec"))

SCHEMAS = {"TrainJob": TRAINJOB, "JobSet": JOBSET}
API_VERSIONS = {"TrainJob": "trainer.kubeflow.org/v1alpha1", "JobSet": "jobset.x-k8s.io/v1alpha2"}


def field_path(path) -> str:
    """jsonschema's path of an error as Kubernetes names fields: spec.replicatedJobs[0].name."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(the document)"


def schema_errors(doc: Any, kind: str) -> list[tuple[str, str]]:
    """(field, what is wrong) for every way `doc` breaks the `kind`'s schema, the most telling first."""
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import best_match

    validator = Draft202012Validator(SCHEMAS[kind])
    errors = list(validator.iter_errors(doc))
    if not errors:
        return []
    first = best_match(errors)
    ordered = [first, *[e for e in errors if e is not first]]
    return [(field_path([*error.absolute_path, *_named(error)]), error.message) for error in ordered]


def _named(error) -> list[str]:
    """The field a required-key or unknown-key error is about, which jsonschema puts in its message only."""
    instance = error.instance if isinstance(error.instance, dict) else {}
    if error.validator == "required":
        return [name for name in error.validator_value if name not in instance][:1]
    if error.validator == "additionalProperties" and error.validator_value is False:
        known = error.schema.get("properties", {})
        return [name for name in instance if name not in known][:1]
    return []
