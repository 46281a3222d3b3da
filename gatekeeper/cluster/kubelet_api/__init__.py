"""The kubelet's two gRPC APIs a DRA driver serves, as protobuf messages.

``dra_v1`` is ``k8s.io/kubelet/pkg/apis/dra/v1/api.proto`` (service
``k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin``: ``NodePrepareResources``,
``NodeUnprepareResources``) and ``pluginregistration_v1`` is
``k8s.io/kubelet/pkg/apis/pluginregistration/v1/api.proto`` (service
``pluginregistration.Registration``: ``GetInfo``, ``NotifyRegistrationStatus``), both
from k8s.io/kubelet v0.37.2 (Apache-2.0), kept here beside the messages protoc 35.1
(grpcio-tools 1.85.1) generated from them: ``scripts/kubelet-api.sh`` regenerates them.
The services' method handlers are written out in ``gatekeeper.cluster.kubelet_plugin``
(no ``_pb2_grpc`` module: grpc's generic handlers take the messages' own (de)serializers).
"""

from gatekeeper.cluster.kubelet_api import dra_v1_pb2, pluginregistration_v1_pb2

__all__ = ["dra_v1_pb2", "pluginregistration_v1_pb2"]
