/* TEMPORARY stubs so the tree builds while the order layer is written. */
#include "../common/internal.h"
void tf_order_config_init(tf_order_config *c) { (void)c; }
int tf_order_create(const tf_dataset *d, const tf_order_config *c, tf_order **o) { (void)d; (void)c; (void)o; return -TF_EUNSUPPORTED; }
void tf_order_free(tf_order *o) { (void)o; }
uint64_t tf_order_num_samples(const tf_order *o) { (void)o; return 0; }
uint64_t tf_order_num_positions(const tf_order *o) { (void)o; return 0; }
uint64_t tf_order_fingerprint(const tf_order *o) { (void)o; return 0; }
uint64_t tf_order_sample_at(const tf_order *o, uint64_t p) { (void)o; return p; }
int tf_order_fill_sample(const tf_order *o, uint64_t s, void *out, tf_dtype d, const tf_sample_extras *e) { (void)o; (void)s; (void)out; (void)d; (void)e; return -TF_EUNSUPPORTED; }
