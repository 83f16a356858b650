"""The C declarations both halves of :mod:`softrdma.capi` share (cffi ``cdef`` text).

``TYPES``: the flat records C and Python exchange (defined identically in ``shim.c``)
and the libibverbs attribute structs Python fills in place (``...;``: cffi takes their
layout from ``<infiniband/verbs.h>`` at build time; enum fields are declared ``int``).
``C_EXPORTS``: functions of ``shim.c`` Python calls (the completion ring).
``PY_EXPORTS``: the Python half, called from C (cffi ``extern "Python"``, embedding API).
Handles are positive ints; a verb that fails returns a negative errno (object verbs) or a
positive errno (int verbs).
"""

from __future__ import annotations

__all__ = ["TYPES", "C_EXPORTS", "PY_EXPORTS"]

TYPES = """
struct sr_swr {
    uint64_t wr_id;
    uint64_t sg;
    uint32_t num_sge, opcode, send_flags, imm_data;
    uint64_t remote_addr, compare_add, swap;
    uint64_t bind_length;
    uint32_t rkey, ah, remote_qpn, remote_qkey;
    uint32_t xrc_srqn;
    uint32_t mw, mr, mw_access;
    uint32_t gen;
};
struct sr_rwr { uint64_t wr_id; uint64_t sg; uint32_t num_sge; };
struct sr_qp_init {
    int32_t qp_type, send_cq, recv_cq, srq, sq_sig_all;
    uint32_t max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline_data;
    uint32_t qp_num;
};
struct sr_ah_attr {
    uint8_t dgid[16];
    uint32_t flow_label;
    uint32_t sgid_index, hop_limit, traffic_class, is_global, dlid, sl, src_path_bits,
        static_rate, port_num;
};
struct sr_qp_attr {
    uint32_t qp_state, cur_qp_state, path_mtu, qkey, rq_psn, sq_psn, dest_qp_num,
        qp_access_flags, pkey_index, max_rd_atomic, max_dest_rd_atomic, min_rnr_timer,
        port_num, timeout, retry_cnt, rnr_retry, sq_draining;
    uint32_t max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline_data;
    struct sr_ah_attr ah;
};
struct sr_srq_attr { uint32_t max_wr, max_sge, srq_limit; };
struct ibv_sge { uint64_t addr; uint32_t length; uint32_t lkey; };
struct sr_cm_addr { uint32_t family; uint16_t port; uint8_t ip[16]; };
struct sr_cm_info {
    int32_t ctx, dev_index, async_fd, port_num;
    void *ctx_wrapper;
    struct sr_cm_addr src, dst;
};
struct sr_conn_param {
    uint8_t private_data[256];
    uint32_t private_data_len, responder_resources, initiator_depth, flow_control,
        retry_count, rnr_retry_count, srq, qp_num;
    int32_t has;
};
struct sr_cm_event_rec {
    int32_t event, status, id, listen_id;
    void *id_wrapper;
    void *listen_id_wrapper;
    uint8_t private_data[256];
    uint32_t private_data_len, responder_resources, initiator_depth, flow_control,
        retry_count, rnr_retry_count, srq, qp_num;
    uint32_t has_ud, ud_qp_num, ud_qkey;
    struct sr_ah_attr ah;
};
struct ibv_device_attr {
    char fw_ver[64];
    uint64_t node_guid;
    uint64_t sys_image_guid;
    uint64_t max_mr_size;
    uint64_t page_size_cap;
    uint32_t vendor_id;
    uint32_t vendor_part_id;
    uint32_t hw_ver;
    int max_qp; int max_qp_wr; unsigned int device_cap_flags; int max_sge; int max_sge_rd;
    int max_cq; int max_cqe; int max_mr; int max_pd; int max_qp_rd_atom; int max_ee_rd_atom;
    int max_res_rd_atom; int max_qp_init_rd_atom; int max_ee_init_rd_atom; int atomic_cap;
    int max_ee; int max_rdd; int max_mw; int max_raw_ipv6_qp; int max_raw_ethy_qp;
    int max_mcast_grp; int max_mcast_qp_attach; int max_total_mcast_qp_attach; int max_ah;
    int max_fmr; int max_map_per_fmr; int max_srq; int max_srq_wr; int max_srq_sge;
    uint16_t max_pkeys; uint8_t local_ca_ack_delay; uint8_t phys_port_cnt;
    ...;
};
struct ibv_port_attr {
    int state; int max_mtu; int active_mtu; int gid_tbl_len;
    uint32_t port_cap_flags; uint32_t max_msg_sz; uint32_t bad_pkey_cntr; uint32_t qkey_viol_cntr;
    uint16_t pkey_tbl_len; uint16_t lid; uint16_t sm_lid;
    uint8_t lmc; uint8_t max_vl_num; uint8_t sm_sl; uint8_t subnet_timeout;
    uint8_t init_type_reply; uint8_t active_width; uint8_t active_speed; uint8_t phys_state;
    uint8_t link_layer; uint8_t flags;
    ...;
};
"""

C_EXPORTS = """
void *sr_rq_ring(void *wrapper, uint32_t cap);
void *sr_srq_ring(void *wrapper, uint32_t cap);
int sr_rq_drain(void *ring, uint64_t *wr_id, uint64_t *addr, uint32_t *length, uint32_t *lkey,
                int most, uint32_t qlen, int close);
void sr_rq_reopen(void *ring, uint32_t qlen);
int sr_ring_push(void *ring, uint64_t wr_id, int status, int opcode, uint32_t vendor_err,
                 uint32_t byte_len, uint32_t imm_or_rkey, uint32_t qp_num, uint32_t src_qp,
                 unsigned int wc_flags, uint16_t pkey_index, uint16_t slid, uint8_t sl,
                 uint8_t dlid_path_bits);
int sr_ring_count(void *ring);
int sr_ring_resize(void *ring, uint32_t cqe);
void sr_ring_clean(void *ring, uint32_t qp_num);
void sr_keep_program_sigint(void);
"""

PY_EXPORTS = """
int sr_py_ndevices(void);
int sr_py_device(int index, char *name, uint64_t *guid, int *iwarp);
int sr_py_open(int index, int *async_fd);
int sr_py_get_async_event(int ctx, int *event_type, void **element, int *port_num);
int sr_py_destroy(int h);
int sr_py_query_device(int ctx, struct ibv_device_attr *attr);
int sr_py_query_port(int ctx, int port, struct ibv_port_attr *attr);
int sr_py_query_gid(int ctx, int port, int index, uint8_t *raw);
int sr_py_query_gid_type(int ctx, int port, int index, int *type);
int sr_py_query_pkey(int ctx, int port, int index, uint16_t *pkey);
int sr_py_alloc_pd(int ctx);
int sr_py_reg_mr(int pd, void *addr, size_t length, uint64_t iova, int access,
                 uint32_t *lkey, uint32_t *rkey);
int sr_py_clean_cq(int cq, uint32_t qp_num);
int sr_py_rereg_mr(int mr, int pd, void *addr, size_t length, uint64_t iova, int access,
                   int translation);
int sr_py_create_comp_channel(int ctx, int *fd);
int sr_py_get_cq_event(int channel, void **cq);  /* *cq: the CQ's wrapper */
int sr_py_create_cq(int ctx, int cqe, int channel, int comp_vector, void *ring,
                    void *wrapper);
int sr_py_req_notify_cq(int cq, int solicited_only);
int sr_py_progress(int cq, int taken);
int sr_py_at_exit(void);
int sr_py_create_srq(int pd, struct sr_srq_attr *attr, void *wrapper);
int sr_py_modify_srq(int srq, struct sr_srq_attr *attr, int mask);
int sr_py_query_srq(int srq, struct sr_srq_attr *attr);
int sr_py_mcast(int qp, uint8_t *gid, int lid, int attach);
int sr_py_create_qp(int pd, struct sr_qp_init *attr, void *wrapper);
int sr_py_modify_qp(int qp, struct sr_qp_attr *attr, int mask);
int sr_py_query_qp(int qp, struct sr_qp_attr *attr, int mask);
int sr_py_create_ah(int pd, struct sr_ah_attr *attr);
int sr_py_alloc_mw(int pd, int type, uint32_t *rkey);
int sr_py_bind_mw(int qp, int mw, int mr, uint64_t addr, uint64_t length, unsigned int access,
                  uint64_t wr_id, unsigned int send_flags, uint32_t *rkey);
int sr_py_post_send(int qp, struct sr_swr *wr, int n, int *bad);
int sr_py_post_recv(int h, int is_srq, struct sr_rwr *wr, int n, int *bad);
int sr_py_resize_cq(int cq, int cqe);
int sr_py_open_xrcd(int ctx, int fd, int oflags);
int sr_py_create_xrc_srq(int pd, int xrcd, int cq, struct sr_srq_attr *attr, void *wrapper,
                         uint32_t *srq_num);
int sr_py_cm_channel(int *fd);
int sr_py_cm_create_id(int channel, int ps, int qp_type, void *wrapper);
int sr_py_cm_set_wrapper(int h, void *wrapper);
int sr_py_cm_destroy_id(int id);
int sr_py_cm_info(int id, struct sr_cm_info *info);
int sr_py_cm_bind(int id, struct sr_cm_addr *addr);
int sr_py_cm_resolve_addr(int id, struct sr_cm_addr *src, struct sr_cm_addr *dst,
                          int timeout_ms);
int sr_py_cm_resolve_route(int id, int timeout_ms);
int sr_py_cm_listen(int id, int backlog);
int sr_py_cm_create_qp(int id, int owner, struct sr_qp_init *attr, void *wrapper);
int sr_py_cm_drop_qp(int id);
int sr_py_cm_connect(int id, struct sr_conn_param *param);
int sr_py_cm_accept(int id, struct sr_conn_param *param);
int sr_py_cm_reject(int id, uint8_t *data, int len);
int sr_py_cm_disconnect(int id);
int sr_py_cm_migrate(int id, int channel);
int sr_py_cm_set_option(int id, int level, int optname, int value);
int sr_py_cm_get_event(int channel, struct sr_cm_event_rec *rec);
int sr_py_cm_device(int index, struct sr_cm_info *info);
int sr_py_cm_mcast(int id, struct sr_cm_addr *addr, int send_only, int join);
int sr_py_cm_init_qp_attr(int id, int state, struct sr_qp_attr *attr, int *mask);
int sr_py_cm_establish(int id);
int sr_py_cm_notify(int id, int event);
"""
