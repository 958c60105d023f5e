// probe.cpp: e2e/ec-queries.sh's probe. POOL NS OID SNAPID...: list_snaps,
// then at each snapshot and at the head: stat, mapext, sparse_read, read and
// checksum (xxhash64 per 4 KiB, over the object rounded up to 4 KiB, and
// with length 0), each with its return value, answer and time. Connects as
// client.admin with $CEPH_CONF.
#include <rados/librados.hpp>
#include <rados/librados.h>
#include <cstdio>
#include <cstring>
#include <chrono>
#include <map>
#include <string>
using namespace librados;
static double ms(std::chrono::steady_clock::time_point t){return std::chrono::duration<double,std::milli>(std::chrono::steady_clock::now()-t).count();}
int main(int argc,char**argv){
  Rados r; r.init("admin"); r.conf_read_file(getenv("CEPH_CONF")); if(int e=r.connect()){printf("connect %d\n",e);return 1;}
  IoCtx io; if(int e=r.ioctx_create(argv[1],io)){printf("ioctx %d\n",e);return 1;}
  io.set_namespace(argv[2]); std::string oid=argv[3];
  { io.snap_set_read(LIBRADOS_SNAP_DIR); snap_set_t ss; auto t=std::chrono::steady_clock::now(); int e=io.list_snaps(oid,&ss);
    printf("list_snaps r=%d (%.2f ms) seq=%llu\n",e,ms(t),(unsigned long long)ss.seq);
    for(auto&c:ss.clones){printf("  clone %llx size %llu snaps",(unsigned long long)c.cloneid,(unsigned long long)c.size);for(auto s:c.snaps)printf(" %llu",(unsigned long long)s);printf(" overlap");for(auto&o:c.overlap)printf(" %llu+%llu",(unsigned long long)o.first,(unsigned long long)o.second);printf("\n");}}
  for(int a=4;a<=argc;a++){
    uint64_t snap = a<argc? strtoull(argv[a],0,0): LIBRADOS_SNAP_HEAD;
    io.snap_set_read(snap); printf("== snap %s\n", a<argc?argv[a]:"head");
    uint64_t size=0; time_t mt; auto t=std::chrono::steady_clock::now(); int e=io.stat(oid,&size,&mt); printf(" stat r=%d size=%llu (%.2f ms)\n",e,(unsigned long long)size,ms(t));
    std::map<uint64_t,uint64_t> m; t=std::chrono::steady_clock::now(); e=io.mapext(oid,0,4<<20,m); printf(" mapext r=%d n=%zu (%.2f ms):",e,m.size(),ms(t)); int k=0; for(auto&x:m){ if(k++<6) printf(" %llu+%llu",(unsigned long long)x.first,(unsigned long long)x.second);} printf("\n");
    { std::map<uint64_t,uint64_t> sm; bufferlist bl; t=std::chrono::steady_clock::now(); e=io.sparse_read(oid,sm,bl,4<<20,0); printf(" sparse_read r=%d n=%zu bytes=%u (%.2f ms):",e,sm.size(),bl.length(),ms(t)); k=0; for(auto&x:sm){ if(k++<6) printf(" %llu+%llu",(unsigned long long)x.first,(unsigned long long)x.second);} printf("\n");}
    { bufferlist bl; t=std::chrono::steady_clock::now(); e=io.read(oid,bl,4<<20,0); printf(" read r=%d bytes=%u (%.2f ms)\n",e,bl.length(),ms(t));}
    { ObjectReadOperation op; bufferlist init; uint64_t seed=0; init.append((const char*)&seed, sizeof(seed)); bufferlist out; int rv=0;
      uint64_t len = size? (size+4095)/4096*4096 : 4096;
      op.checksum(LIBRADOS_CHECKSUM_TYPE_XXHASH64, init, 0, len, 4096, &out, &rv);
      t=std::chrono::steady_clock::now(); e=io.operate(oid,&op,nullptr); printf(" checksum(0,%llu,4096) r=%d rv=%d out=%u bytes (%.2f ms)\n",(unsigned long long)len,e,rv,out.length(),ms(t));
      if (size % 4096) {
        ObjectReadOperation op3; bufferlist out3; int rv3=0; uint64_t whole = size/4096*4096;
        op3.checksum(LIBRADOS_CHECKSUM_TYPE_XXHASH64, init, 0, whole, 4096, &out3, &rv3);
        t=std::chrono::steady_clock::now(); e=io.operate(oid,&op3,nullptr); printf(" checksum(0,%llu,4096) r=%d rv=%d out=%u bytes (%.2f ms)\n",(unsigned long long)whole,e,rv3,out3.length(),ms(t));
      }
      ObjectReadOperation op2; bufferlist out2; int rv2=0; op2.checksum(LIBRADOS_CHECKSUM_TYPE_XXHASH64, init, 0, 0, 4096, &out2, &rv2);
      t=std::chrono::steady_clock::now(); e=io.operate(oid,&op2,nullptr); printf(" checksum(0,0,4096) r=%d rv=%d out=%u bytes (%.2f ms)\n",e,rv2,out2.length(),ms(t));
    }
  }
  return 0;
}
