"""ordermq's own gRPC protocol (proto/ordermq/v1) over the broker's core.

MessagingService, AdminService and the Exchange stream translate protobuf into the same
calls every front makes.
"""
