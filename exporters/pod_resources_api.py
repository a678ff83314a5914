"""The kubelet pod-resources v1 messages, built with protobuf's descriptor API.

The fields are those of k8s.io/kubelet/pkg/apis/podresources/v1/api.proto (package
`v1`, service `PodResourcesLister`) that the agent reads; numbers and types match the
kubelet's, so its responses parse here and the fields left out (dynamic resources,
added later) are kept as unknown fields rather than failing the parse. Building the
descriptor at import time needs no generated `_pb2` module and no grpcio-tools.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory  # type: ignore[import-untyped]

PACKAGE = "v1"
SERVICE = "PodResourcesLister"
LIST_METHOD = f"/{PACKAGE}.{SERVICE}/List"

_F = descriptor_pb2.FieldDescriptorProto
# message -> [(field name, number, type, label, message type name or None)]
_MESSAGES: dict[str, list[tuple[str, int, int, int, str | None]]] = {
    "ListPodResourcesRequest": [],
    "ListPodResourcesResponse": [("pod_resources", 1, _F.TYPE_MESSAGE, _F.LABEL_REPEATED, "PodResources")],
    "PodResources": [
        ("name", 1, _F.TYPE_STRING, _F.LABEL_OPTIONAL, None),
        ("namespace", 2, _F.TYPE_STRING, _F.LABEL_OPTIONAL, None),
        ("containers", 3, _F.TYPE_MESSAGE, _F.LABEL_REPEATED, "ContainerResources"),
    ],
    "ContainerResources": [
        ("name", 1, _F.TYPE_STRING, _F.LABEL_OPTIONAL, None),
        ("devices", 2, _F.TYPE_MESSAGE, _F.LABEL_REPEATED, "ContainerDevices"),
        ("cpu_ids", 3, _F.TYPE_INT64, _F.LABEL_REPEATED, None),
        ("memory", 4, _F.TYPE_MESSAGE, _F.LABEL_REPEATED, "ContainerMemory"),
    ],
    "ContainerMemory": [
        ("memory_type", 1, _F.TYPE_STRING, _F.LABEL_OPTIONAL, None),
        ("size", 2, _F.TYPE_UINT64, _F.LABEL_OPTIONAL, None),
        ("topology", 3, _F.TYPE_MESSAGE, _F.LABEL_OPTIONAL, "TopologyInfo"),
    ],
    "ContainerDevices": [
        ("resource_name", 1, _F.TYPE_STRING, _F.LABEL_OPTIONAL, None),
        ("device_ids", 2, _F.TYPE_STRING, _F.LABEL_REPEATED, None),
        ("topology", 3, _F.TYPE_MESSAGE, _F.LABEL_OPTIONAL, "TopologyInfo"),
    ],
    "TopologyInfo": [("nodes", 1, _F.TYPE_MESSAGE, _F.LABEL_REPEATED, "NUMANode")],
    "NUMANode": [("ID", 1, _F.TYPE_INT64, _F.LABEL_OPTIONAL, None)],
}


def _file_descriptor() -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto(
        name="inferd/podresources/v1/api.proto", package=PACKAGE, syntax="proto3"
    )
    for message_name, fields in _MESSAGES.items():
        message = proto.message_type.add(name=message_name)
        for name, number, kind, label, type_name in fields:
            entry = message.field.add(name=name, number=number, type=kind, label=label)
            if type_name is not None:
                entry.type_name = f".{PACKAGE}.{type_name}"
            if label == _F.LABEL_REPEATED and kind == _F.TYPE_INT64:
                entry.options.packed = True
    service = proto.service.add(name=SERVICE)
    service.method.add(
        name="List",
        input_type=f".{PACKAGE}.ListPodResourcesRequest",
        output_type=f".{PACKAGE}.ListPodResourcesResponse",
    )
    return proto


# A private pool: another copy of these messages elsewhere in the process (the
# kubernetes package, a generated module) cannot clash with this one.
_POOL = descriptor_pool.DescriptorPool()
_POOL.Add(_file_descriptor())


def _message_class(name: str) -> Any:
    return message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"{PACKAGE}.{name}"))


ListPodResourcesRequest = _message_class("ListPodResourcesRequest")
ListPodResourcesResponse = _message_class("ListPodResourcesResponse")
PodResources = _message_class("PodResources")
ContainerResources = _message_class("ContainerResources")
ContainerDevices = _message_class("ContainerDevices")
ContainerMemory = _message_class("ContainerMemory")
TopologyInfo = _message_class("TopologyInfo")
NUMANode = _message_class("NUMANode")
